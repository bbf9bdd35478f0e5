// Tandem's data library in one include: Dataset, Example, Batch and Collate; samplers;
// the DataLoader; and the datasets RandomDataset, TensorDataset, Subset and FashionMnist.
//
//   #include "data/data.h"
//   tandem::data::DataLoader loader(tandem::data::RandomDataset(5, 100),
//                                   tandem::data::DataLoaderOptions().batch_size(30));
//   for (tandem::data::Batch& batch : loader) { /* batch.data(): [30, 5], ..., [10, 5] */ }
#ifndef TANDEM_DATA_DATA_H_
#define TANDEM_DATA_DATA_H_

#include "data/dataloader.h"      // IWYU pragma: export
#include "data/dataset.h"         // IWYU pragma: export
#include "data/fashion_mnist.h"   // IWYU pragma: export
#include "data/idx.h"             // IWYU pragma: export
#include "data/random_dataset.h"  // IWYU pragma: export
#include "data/sampler.h"         // IWYU pragma: export
#include "data/subset.h"          // IWYU pragma: export
#include "data/tensor_dataset.h"  // IWYU pragma: export
#include "data/text_corpus.h"     // IWYU pragma: export

#endif  // TANDEM_DATA_DATA_H_
