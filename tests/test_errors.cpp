// Error paths: one test per op family showing the exception type (ValueError, IndexError, TypeError,
// NotImplementedError, all braid::Error) and that the message names the op and the operands, for
// bad shapes, axes, dtypes and indices. Nothing here may abort or return a silent wrong answer.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "braid/braid.h"

namespace braid {
namespace {

/// Runs f, expecting exactly an exception of type E whose what() contains every substring.
template <typename E>
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> substrings, const char* expr) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& s : substrings)
      EXPECT_NE(msg.find(s), std::string::npos) << expr << ": message \"" << msg << "\" lacks \"" << s << "\"";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << expr << ": expected " << typeid(E).name() << ", got " << typeid(e).name() << ": " << e.what();
    return;
  }
  ADD_FAILURE() << expr << ": expected " << typeid(E).name() << ", nothing was thrown";
}

#define EXPECT_ERROR(Type, stmt, ...) expect_error<Type>([&] { (void)(stmt); }, {__VA_ARGS__}, #stmt)

Tensor f32(const Shape& s) { return zeros(s, kFloat32); }
Tensor idx(std::vector<int64_t> v, const Shape& s) { return tensor(v, s); }

TEST(Errors, HierarchyMapsOntoPython) {
  // Every braid error is a braid::Error and a std::runtime_error, so callers can catch either.
  EXPECT_THROW(matmul(f32({2, 3}), f32({4, 5})), Error);
  EXPECT_THROW(matmul(f32({2, 3}), f32({4, 5})), std::runtime_error);
  EXPECT_THROW(sum(f32({2, 2}), {5}), Error);
  EXPECT_THROW(matmul(zeros({2, 2}, kBool), zeros({2, 2}, kBool)), Error);
  static_assert(std::is_base_of_v<Error, ValueError> && std::is_base_of_v<Error, IndexError> &&
                std::is_base_of_v<Error, TypeError> && std::is_base_of_v<Error, NotImplementedError> &&
                std::is_base_of_v<Error, DistributedError> && std::is_base_of_v<std::runtime_error, Error>);
}

TEST(Errors, Matmul) {
  EXPECT_THROW(matmul(f32({2, 3}), f32({4, 5})), ValueError);
  EXPECT_ERROR(ValueError, matmul(f32({2, 3}), f32({4, 5})), "matmul", "[2, 3]", "[4, 5]", "3 != 4");
  EXPECT_ERROR(ValueError, matmul(f32({2, 3, 4}), f32({5, 6})), "matmul", "4 != 5");
  EXPECT_ERROR(ValueError, matmul(f32({3}), f32({4})), "matmul");
  EXPECT_ERROR(ValueError, matmul(f32({2, 3, 4}), f32({3, 4, 5})), "matmul", "[2]", "[3]");  // batch 2 vs 3
  EXPECT_ERROR(ValueError, matmul(f32({}), f32({3})), "matmul", "[]");
  EXPECT_ERROR(TypeError, matmul(zeros({2, 2}, kBool), zeros({2, 2}, kBool)), "matmul", "bool");
  EXPECT_ERROR(TypeError, matmul(zeros({2, 2}, kInt8), f32({2, 2})), "matmul", "int8");
}

TEST(Errors, Broadcasting) {
  EXPECT_ERROR(ValueError, add(f32({2, 3}), f32({4})), "add", "[2, 3]", "[4]");
  EXPECT_ERROR(ValueError, f32({2, 3}) + f32({2}), "add", "[2, 3]", "[2]");
  EXPECT_ERROR(ValueError, sub(f32({5, 1}), f32({3, 2})), "sub", "[5, 1]", "[3, 2]");
  EXPECT_ERROR(ValueError, mul(f32({3}), f32({4})), "mul", "[3]", "[4]");
  EXPECT_ERROR(ValueError, div(f32({2, 2}), f32({3})), "div");
  EXPECT_ERROR(ValueError, maximum(f32({2}), f32({3})), "maximum");
  EXPECT_ERROR(ValueError, pow(f32({2}), f32({3})), "pow");
  EXPECT_ERROR(ValueError, eq(f32({2}), f32({3})), "eq", "[2]", "[3]");
  EXPECT_ERROR(ValueError, logical_and(zeros({2}, kBool), zeros({3}, kBool)), "logical_and");
  EXPECT_ERROR(ValueError, where(zeros({4}, kBool), f32({2}), f32({2})), "where", "[4]");
  EXPECT_ERROR(ValueError, broadcast_shapes({2, 3}, {3, 2}, "myop"), "myop", "[2, 3]", "[3, 2]");
  EXPECT_ERROR(ValueError, f32({2, 3}).copy_(f32({3, 2})), "copy_", "[3, 2]", "[2, 3]");
  EXPECT_ERROR(ValueError, f32({2, 3}).add_(f32({2, 3, 1})), "add_");
}

TEST(Errors, Axes) {
  Tensor x = f32({2, 3});
  EXPECT_THROW(sum(x, {5}), IndexError);
  EXPECT_ERROR(IndexError, sum(x, {5}), "sum", "axis 5", "2 dimensions");
  EXPECT_ERROR(IndexError, sum(x, {-3}), "sum", "-3");
  EXPECT_ERROR(ValueError, sum(x, {1, -1}), "sum", "more than once");
  EXPECT_ERROR(IndexError, mean(x, {2}), "mean", "axis 2");
  EXPECT_ERROR(IndexError, prod(x, {2}), "prod");
  EXPECT_ERROR(IndexError, amax(x, {7}), "amax");
  EXPECT_ERROR(IndexError, argmax(x, 2), "argmax", "axis 2");
  EXPECT_ERROR(IndexError, var(x, {3}), "var");
  EXPECT_ERROR(IndexError, logsumexp(x, {2}), "logsumexp");
  EXPECT_ERROR(IndexError, softmax(x, 2), "softmax", "axis 2");
  EXPECT_ERROR(IndexError, log_softmax(x, -3), "log_softmax", "-3");
  EXPECT_ERROR(IndexError, concat({x, x}, 2), "concat", "axis 2");
  EXPECT_ERROR(IndexError, stack({x, x}, 4), "stack");
  EXPECT_ERROR(IndexError, split(x, {1, 1}, 3), "split");
  EXPECT_ERROR(IndexError, narrow(x, 2, 0, 1), "narrow", "axis 2");
  EXPECT_ERROR(IndexError, x.transpose(0, 2), "transpose");
  EXPECT_ERROR(IndexError, x.unsqueeze(3), "unsqueeze");
  EXPECT_ERROR(IndexError, x.squeeze(2), "squeeze");
  EXPECT_ERROR(IndexError, x.size(2), "size");
  EXPECT_ERROR(IndexError, x.select(2, 0), "select");
  EXPECT_ERROR(IndexError, gather(x, 2, idx({0}, {1, 1})), "gather");
  EXPECT_ERROR(IndexError, index_select(x, -3, idx({0}, {1})), "index_select");
  EXPECT_ERROR(IndexError, x.flatten(0, 5), "flatten");
  EXPECT_ERROR(ValueError, x.permute({0}), "permute", "[2, 3]");
  EXPECT_ERROR(ValueError, x.permute({1, 1}), "permute", "twice");
  EXPECT_ERROR(IndexError, x.permute({0, 2}), "permute");
  // Reducing an empty axis has no identity for max/min/logsumexp/argmax.
  EXPECT_ERROR(ValueError, amax(f32({0, 3}), {0}), "amax", "size 0");
  EXPECT_ERROR(ValueError, argmin(f32({2, 0}), 1), "argmin");
}

TEST(Errors, DTypes) {
  // int8 and uint8 are storage (quantised values); the half types compute (Note [Half arithmetic]).
  Tensor q = zeros({2}, kInt8);
  EXPECT_ERROR(TypeError, exp(q), "exp", "int8");
  EXPECT_ERROR(TypeError, add(q, q), "add", "int8");
  EXPECT_ERROR(TypeError, sum(zeros({2}, kUInt8)), "sum", "uint8");
  EXPECT_ERROR(TypeError, relu(q), "relu", "int8");
  EXPECT_ERROR(TypeError, arange(3).set_requires_grad(), "set_requires_grad", "int64");
  EXPECT_ERROR(TypeError, gather(f32({2, 2}), 0, f32({2, 2})), "gather", "index", "float32");
  EXPECT_ERROR(TypeError, index_select(f32({2, 2}), 0, f32({1})), "index_select", "float32");
  EXPECT_ERROR(TypeError, scatter_add(f32({2}), 0, f32({2}), f32({2})), "scatter_add", "float32");
  EXPECT_ERROR(TypeError, one_hot(f32({2})), "one_hot", "float32");
  EXPECT_ERROR(TypeError, where(f32({2}), f32({2}), f32({2})), "where", "bool", "float32");
  EXPECT_ERROR(TypeError, neg(zeros({2}, kBool)), "neg", "bool");
  EXPECT_ERROR(TypeError, rand({2}, kInt64), "rand", "int64");
  EXPECT_ERROR(TypeError, randn({2}, kBool), "randn", "bool");
  EXPECT_ERROR(TypeError, randint(0, 5, {2}, kFloat32), "randint", "float32");
  EXPECT_ERROR(TypeError, f32({2}).data<double>(), "data", "float64", "float32");
}

TEST(Errors, Indices) {
  Tensor x = f32({3, 4});
  EXPECT_ERROR(IndexError, gather(x, 0, idx({0, 3, 1, 2}, {1, 4})), "gather", "3", "size 3");
  EXPECT_ERROR(IndexError, gather(x, 1, idx({-5, 0}, {1, 2})), "gather", "-5");
  EXPECT_ERROR(IndexError, index_select(x, 1, idx({0, 4}, {2})), "index_select", "4", "size 4");
  EXPECT_ERROR(IndexError, scatter_add(x, 0, idx({3}, {1, 1}), f32({1, 1})), "scatter_add", "3");
  EXPECT_ERROR(IndexError, one_hot(idx({0, 5}, {2}), 3), "one_hot", "5", "3 classes");
  EXPECT_ERROR(IndexError, one_hot(idx({-1}, {1}), 3), "one_hot", "-1");
  EXPECT_ERROR(IndexError, narrow(x, 1, 2, 3), "narrow", "exceeds", "4");
  EXPECT_ERROR(IndexError, x.narrow(0, 5, 1), "narrow", "5");
  EXPECT_ERROR(IndexError, x.select(0, 3), "select", "3", "size 3");
  EXPECT_ERROR(IndexError, x.select(1, -5), "select", "-5");
  // Index tensors of the wrong rank or size are shape errors.
  EXPECT_ERROR(ValueError, gather(x, 0, idx({0}, {1})), "gather", "[1]", "[3, 4]");
  EXPECT_ERROR(ValueError, gather(x, 0, idx({0, 0, 0, 0, 0}, {1, 5})), "gather", "[1, 5]");
  EXPECT_ERROR(ValueError, index_select(x, 0, idx({0, 1}, {1, 2})), "index_select", "[1, 2]");
  EXPECT_ERROR(ValueError, one_hot(zeros({0}, kInt64)), "one_hot", "empty");
}

TEST(Errors, ShapesOfViews) {
  Tensor x = f32({2, 3});
  EXPECT_THROW(x.reshape({4, 2}), ValueError);
  EXPECT_ERROR(ValueError, x.reshape({4, 2}), "reshape", "[2, 3]", "[4, 2]");
  EXPECT_ERROR(ValueError, x.reshape({-1, -1}), "reshape", "-1");
  EXPECT_ERROR(ValueError, x.reshape({4, -1}), "reshape", "[2, 3]", "[4, -1]");
  EXPECT_ERROR(ValueError, x.reshape({-2, 3}), "reshape");
  EXPECT_ERROR(ValueError, x.mT().view({6}), "view", "[3, 2]", "reshape");
  EXPECT_ERROR(ValueError, x.expand({4, 3}), "expand", "[2, 3]", "4");
  EXPECT_ERROR(ValueError, x.expand({3}), "expand", "[2, 3]");
  EXPECT_ERROR(ValueError, x.slice(1, 0, 3, 0), "slice", "step");
  EXPECT_ERROR(ValueError, f32({3}).mT(), "mT", "[3]");
  EXPECT_ERROR(ValueError, tril(f32({3})), "tril", "[3]");
  EXPECT_ERROR(ValueError, triu(f32({})), "triu");
}

TEST(Errors, Assembling) {
  Tensor a = f32({2, 3});
  EXPECT_ERROR(ValueError, concat({a, f32({3, 4})}, 1), "concat", "[3, 4]", "[2, 3]");
  EXPECT_ERROR(ValueError, concat({a, f32({2})}, 0), "concat", "[2]");
  EXPECT_ERROR(ValueError, concat({}, 0), "concat");
  EXPECT_ERROR(ValueError, concat({f32({}), f32({})}, 0), "concat", "stack");
  EXPECT_ERROR(ValueError, stack({a, f32({3, 2})}, 0), "stack", "[3, 2]", "[2, 3]");
  EXPECT_ERROR(ValueError, split(f32({2, 5}), {2, 2}, 1), "split", "4", "[2, 5]");
  EXPECT_ERROR(ValueError, split(f32({2, 5}), {6, -1}, 1), "split", "-1");
  EXPECT_ERROR(ValueError, chunk(a, 0, 0), "chunk");
  EXPECT_ERROR(ValueError, pad(a, {1}), "pad", "[2, 3]");
  EXPECT_ERROR(ValueError, pad(a, {1, 1, 1, 1, 1, 1}), "pad");
  EXPECT_ERROR(ValueError, pad(a, {1, 1}, "circular"), "pad", "circular", "constant, reflect, replicate");
  EXPECT_ERROR(ValueError, pad(a, {3, 0}, "reflect"), "pad", "reflect", "3");
  EXPECT_ERROR(ValueError, pad(a, {-4, 0}), "pad", "negative");
  EXPECT_ERROR(ValueError, scatter_add(a, 0, idx({0, 0, 0, 0}, {1, 4}), f32({1, 4})), "scatter_add");
}

TEST(Errors, Creation) {
  EXPECT_ERROR(ValueError, arange(0.0, 5.0, 0.0), "arange", "step");
  EXPECT_ERROR(ValueError, arange(0.0, 5.0, -1.0), "arange", "-1");
  EXPECT_ERROR(ValueError, arange(0.0, std::numeric_limits<double>::infinity()), "arange");
  EXPECT_ERROR(ValueError, linspace(0, 1, -1), "linspace", "-1");
  EXPECT_ERROR(ValueError, eye(-2), "eye", "-2");
  EXPECT_ERROR(ValueError, randint(5, 5, {2}), "randint", "5");
  EXPECT_ERROR(ValueError, randint(6, 2, {2}), "randint", "6", "2");
  EXPECT_ERROR(ValueError, rand({2}, kFloat32, nullptr, 1.0, 0.0), "rand");
  EXPECT_ERROR(ValueError, randn({2}, kFloat32, nullptr, 0.0, -1.0), "randn", "std");
  EXPECT_ERROR(ValueError, bernoulli({2}, 1.5), "bernoulli", "1.5");
  EXPECT_ERROR(ValueError, randperm(-1), "randperm");
  EXPECT_ERROR(ValueError, zeros({2, -3}), "[2, -3]");
  EXPECT_ERROR(ValueError, tensor(std::vector<float>{1, 2, 3}, {2, 2}), "tensor", "3", "[2, 2]");
  EXPECT_ERROR(ValueError, from_buffer(nullptr, {2}, kFloat32), "from_buffer");
  EXPECT_ERROR(NotImplementedError, zeros({2}, kFloat32, Device{DeviceType::CUDA, 0}), "cuda:0");
}

TEST(Errors, ScalarArguments) {
  Tensor x = f32({2});
  EXPECT_ERROR(ValueError, clamp(x, 1.0, -1.0), "clamp", "min", "max");
  EXPECT_ERROR(ValueError, gelu(x, "fast"), "gelu", "fast", "tanh");
  EXPECT_ERROR(ValueError, var(x, {}, -1), "var", "correction");
  EXPECT_ERROR(ValueError, x.item(), "item", "[2]");
  EXPECT_ERROR(ValueError, set_num_threads(0), "set_num_threads", "0");
}

TEST(Errors, UndefinedTensors) {
  Tensor u;
  EXPECT_ERROR(ValueError, u.shape(), "undefined");
  EXPECT_ERROR(ValueError, exp(u), "exp", "undefined");
  EXPECT_ERROR(ValueError, add(u, f32({2})), "add", "undefined");
  EXPECT_ERROR(ValueError, f32({2}) * u, "mul", "undefined");
  EXPECT_ERROR(ValueError, matmul(u, f32({2, 2})), "matmul", "undefined");
  EXPECT_ERROR(ValueError, sum(u), "sum", "undefined");
  EXPECT_ERROR(ValueError, cast(u, kFloat64), "cast", "undefined");
  EXPECT_ERROR(ValueError, concat({f32({2}), u}, 0), "concat", "undefined");
  EXPECT_ERROR(ValueError, u.reshape({1}), "undefined");
  EXPECT_ERROR(ValueError, u.item(), "undefined");
  EXPECT_ERROR(ValueError, f32({2}).copy_(u), "undefined");
}

}  // namespace
}  // namespace braid
