// The data pipeline: datasets, the DataLoader (shuffling, sharding, prefetch, resumable position),
// image transforms, readers for MNIST, CIFAR-10, .npy and CSV files, and the training loop's
// progress line. Namespace braid::data.
#pragma once

#include "braid/data/dataset.h"
#include "braid/data/loader.h"
#include "braid/data/progress.h"
#include "braid/data/readers.h"
#include "braid/data/transforms.h"
