// The Pallas C++ API: include this one header.
#pragma once

#include "pallas/array.h"
#include "pallas/dtype.h"
#include "pallas/error.h"
#include "pallas/evaluate.h"
#include "pallas/ir/ir.h"
#include "pallas/pallas_call.h"
#include "pallas/trace.h"
#include "pallas/transforms.h"
