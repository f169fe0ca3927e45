// Forwarding header: finalize.cu and row_softmax.cu still include this path.
#pragma once
#include "util/cuda_check.h"
