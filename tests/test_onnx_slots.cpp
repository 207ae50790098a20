// The ONNX executor's value slots found by a name's address (Note [Slots by the name's address] in
// onnx/executor.h): a hit is trusted only when the string at that address still holds the slot's
// name, and a lookup by any other string goes through the name.
#include <gtest/gtest.h>

#include <string>
#include <unordered_map>

#include "onnx/executor.h"

namespace braid::onnx {
namespace {

TEST(OnnxSlots, AnAddressHitIsCheckedAgainstTheSlotsNameAndFallsBackToTheName) {
  const std::unordered_map<std::string, int> index{{"conv1.out", 0}, {"relu1.out", 1}};
  std::string graph_input = "conv1.out";  // a graph's own string, numbered by its address
  SlotAddresses by_address;
  by_address.name.resize(2);
  for (const auto& [name, k] : index) by_address.name[static_cast<size_t>(k)] = &name;
  by_address.at.emplace(&graph_input, 0);
  Scope scope;
  scope.use_slots(&index, &by_address);

  EXPECT_EQ(scope.slot_of(graph_input), 0);               // by address
  EXPECT_EQ(scope.slot_of(std::string("relu1.out")), 1);  // another string: by name
  EXPECT_EQ(scope.slot_of(std::string("conv1.out")), 0);
  EXPECT_EQ(scope.slot_of(std::string("missing")), -1);
  // The string at the recorded address now names another value: its own slot, not the recorded one.
  graph_input = "relu1.out";
  EXPECT_EQ(scope.slot_of(graph_input), 1);
  graph_input = "not.a.value";
  EXPECT_EQ(scope.slot_of(graph_input), -1);
  // Without addresses, names alone.
  Scope plain;
  plain.use_slots(&index);
  EXPECT_EQ(plain.slot_of(std::string("relu1.out")), 1);
  EXPECT_EQ(plain.slot_of(std::string("x")), -1);

  // A bound slot is found through find(); an unbound one is not.
  scope.slots[1] = zeros({2});
  scope.bound[1] = 1;
  ASSERT_NE(scope.find(graph_input = "relu1.out"), nullptr);
  EXPECT_EQ(scope.find("relu1.out")->shape(), (Shape{2}));
  EXPECT_EQ(scope.find("conv1.out"), nullptr);
}

}  // namespace
}  // namespace braid::onnx
