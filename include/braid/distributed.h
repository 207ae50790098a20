// The distributed runtime: process groups over MPI (or a world of one), data-parallel and
// tensor-parallel training.
#pragma once

#include "braid/distributed/data_parallel.h"
#include "braid/distributed/hierarchical.h"
#include "braid/distributed/local_sgd.h"
#include "braid/distributed/parameter_server.h"
#include "braid/distributed/sharded.h"
#include "braid/distributed/preemption.h"
#include "braid/distributed/process_group.h"
#include "braid/distributed/tensor_parallel.h"
