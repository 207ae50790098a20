// Optimizers, learning-rate schedules and gradient clipping: everything a training loop needs
// besides the model and the loss.
#pragma once

#include "braid/optim/lr_scheduler.h"
#include "braid/optim/optimizer.h"
#include "braid/optim/optimizers.h"
