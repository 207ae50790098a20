// Optimizers, learning-rate schedules, gradient clipping and loss scaling: everything a training
// loop needs besides the model and the loss.
#pragma once

#include "braid/optim/grad_scaler.h"
#include "braid/optim/lr_scheduler.h"
#include "braid/optim/optimizer.h"
#include "braid/optim/optimizers.h"
