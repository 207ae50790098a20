// The umbrella header: everything a program that uses braid includes.
#pragma once

#include "braid/amp.h"
#include "braid/autograd.h"
#include "braid/config.h"
#include "braid/conv.h"
#include "braid/dtype.h"
#include "braid/error.h"
#include "braid/indexing.h"
#include "braid/ops.h"
#include "braid/parallel.h"
#include "braid/random.h"
#include "braid/storage.h"
#include "braid/tensor.h"
