// Module's tree API as libtorch and PyTorch define it: named_modules() lists the module itself
// first as (prefix, self) and then its descendants depth first with dotted paths; children(),
// modules() and buffers() are the unnamed lists; state_dict() maps every parameter and buffer name
// to the module's own tensor. Python's nn.Module methods are these functions, generated.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "braid/nn/nn.h"
#include "error_of.h"

namespace braid {
namespace {

using namespace nn;

// features: Sequential(Linear, ReLU, Sequential(BatchNorm1d)), head: Linear.
struct Net : Module {
  Net() : Module("Net") {
    auto inner = std::make_shared<Sequential>();
    inner->add(std::make_shared<BatchNorm1d>(3));
    features = register_module("features", std::make_shared<Sequential>(
                                               std::vector<ModulePtr>{std::make_shared<Linear>(2, 3),
                                                                      std::make_shared<ReLU>(), inner}));
    head = register_module("head", std::make_shared<Linear>(3, 1, false));
  }
  Tensor forward(const Tensor& x) override { return head->forward(features->forward(x)); }
  std::shared_ptr<Sequential> features;
  std::shared_ptr<Linear> head;
};

std::vector<std::string> names(const std::vector<std::pair<std::string, ModulePtr>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, m] : named) out.push_back(n);
  return out;
}

TEST(Module, NamedModulesListsItselfFirstThenDescendantsDepthFirst) {
  auto net = std::make_shared<Net>();
  auto all = net->named_modules();
  EXPECT_EQ(names(all), (std::vector<std::string>{"", "features", "features.0", "features.1", "features.2",
                                                  "features.2.0", "head"}));
  EXPECT_EQ(all[0].second.get(), net.get());
  EXPECT_EQ(all[1].second, net->features);
  EXPECT_EQ(all.back().second, net->head);
  EXPECT_EQ(all[5].second->type_name(), "BatchNorm1d");
  // Each entry is the module at that path.
  for (size_t i = 1; i < all.size(); ++i) EXPECT_EQ(net->child(all[i].first), all[i].second) << all[i].first;

  auto below = net->named_modules("model", false);
  EXPECT_EQ(names(below), (std::vector<std::string>{"model.features", "model.features.0", "model.features.1",
                                                    "model.features.2", "model.features.2.0", "model.head"}));
  EXPECT_EQ(names(net->named_modules("model")).front(), "model");
}

TEST(Module, ModulesAndChildrenAreTheRegisteredObjects) {
  auto net = std::make_shared<Net>();
  auto mods = net->modules();
  ASSERT_EQ(mods.size(), 7u);
  EXPECT_EQ(mods[0].get(), net.get());
  EXPECT_EQ(net->modules(false).size(), 6u);
  EXPECT_EQ(net->modules(false)[0], net->features);
  auto kids = net->children();
  ASSERT_EQ(kids.size(), 2u);
  EXPECT_EQ(kids[0], net->features);
  EXPECT_EQ(kids[1], net->head);
  EXPECT_EQ(net->features->children().size(), 3u);
  EXPECT_TRUE(std::make_shared<ReLU>()->children().empty());
}

TEST(Module, ListingItselfNeedsASharedPtr) {
  Net on_stack;
  std::string msg = error_of<ValueError>([&] { on_stack.named_modules(); });
  EXPECT_NE(msg.find("Net.named_modules"), std::string::npos) << msg;
  EXPECT_NE(msg.find("std::make_shared"), std::string::npos) << msg;
  EXPECT_EQ(on_stack.named_modules("", false).size(), 6u);  // the descendants need no shared_ptr of the root
  EXPECT_EQ(on_stack.modules(false).size(), 6u);
}

TEST(Module, BuffersAndStateDictShareTheModulesTensors) {
  auto net = std::make_shared<Net>();
  auto bn = std::dynamic_pointer_cast<BatchNorm1d>(net->child("features.2.0"));
  ASSERT_NE(bn, nullptr);
  auto named = net->named_buffers();
  auto bufs = net->buffers();
  ASSERT_EQ(bufs.size(), 3u);
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].first, "features.2.0.running_mean");
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(&bufs[i].impl(), &named[i].second.impl()) << named[i].first;
  EXPECT_TRUE(net->buffers(false).empty());
  EXPECT_EQ(bn->buffers(false).size(), 3u);

  StateDict sd = net->state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : sd) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"features.0.bias", "features.0.weight", "features.2.0.bias",
                                            "features.2.0.num_batches_tracked", "features.2.0.running_mean",
                                            "features.2.0.running_var", "features.2.0.weight", "head.weight"}));
  EXPECT_EQ(&sd.at("head.weight").impl(), &net->head->weight().impl());  // shared, not copied
}

}  // namespace
}  // namespace braid
