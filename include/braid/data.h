// The data pipeline: datasets, the DataLoader (shuffling, sharding, prefetch, resumable position),
// image transforms and readers for MNIST, CIFAR-10, .npy and CSV files. Namespace braid::data.
#pragma once

#include "braid/data/dataset.h"
#include "braid/data/loader.h"
#include "braid/data/readers.h"
#include "braid/data/transforms.h"
