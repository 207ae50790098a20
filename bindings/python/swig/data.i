// braid._swig.data: datasets, the DataLoader, transforms and the readers (braid/data/*.h). Dataset
// is a director class: braid/data.py's Dataset maps a Python __getitem__/__len__ onto get/size,
// which the loader's background thread calls (taking the GIL).
%module(package="braid._swig", directors="1") data

%include "braid.swg"

%{
#include "braid/data.h"
%}

%import "core.i"

%shared_ptr(braid::data::Dataset)
%shared_ptr(braid::data::TensorDataset)
%shared_ptr(braid::data::Transform)
%shared_ptr(braid::data::Normalize)
%shared_ptr(braid::data::RandomCrop)
%shared_ptr(braid::data::RandomHorizontalFlip)
%feature("director") braid::data::Dataset;

%template(TransformVector) std::vector<std::shared_ptr<const braid::data::Transform>>;

%ignore braid::data::DataLoader::Iterator;
%ignore braid::data::DataLoader::begin;
%ignore braid::data::DataLoader::end;
%ignore braid::data::DataLoader::dataset;
// std::optional<Device> as a member is set through a method (None leaves batches where they are).
%ignore braid::data::DataLoaderOptions::device;
%extend braid::data::DataLoaderOptions {
  void set_device(braid::Device device) { $self->device = device; }
}

// TensorDataset as a Python sequence of (input, target) pairs, as torch's.
%extend braid::data::TensorDataset {
  int64_t __len__() const { return $self->size(); }
  std::pair<braid::Tensor, braid::Tensor> __getitem__(int64_t index) const {
    braid::data::Example e = $self->get(index);
    return {e.input, e.target};
  }
}
%include "braid/data/dataset.h"
%include "braid/data/transforms.h"
%include "braid/data/loader.h"
%include "braid/data/readers.h"
