// The umbrella header of braid's layer library: Module and containers, initialisers, every layer
// and the losses.
#pragma once

#include "braid/braid.h"
#include "braid/nn/attention.h"
#include "braid/nn/init.h"
#include "braid/nn/layers.h"
#include "braid/nn/loss.h"
#include "braid/nn/module.h"
#include "braid/nn/recurrent.h"
#include "braid/nn/skip.h"
