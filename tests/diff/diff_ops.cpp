// The differential test's op table: each generator op name mapped to the braid call it checks, with
// the name braid's errors use for it. Filled explicitly, one line per op of ops.h.
#include <cstdlib>
#include <optional>

#include "braid/conv.h"
#include "diff/diff_runner.h"

namespace braid::diff {
namespace {

using Ins = std::vector<Tensor>;
using Outs = std::vector<Tensor>;

int64_t I(const Json& a, const char* k) { return a.at(k).get<int64_t>(); }
// JSON has no NaN or infinity, so the generator writes those as the strings "nan", "inf", "-inf".
double num(const Json& v) {
  return v.is_string() ? std::strtod(v.get<std::string>().c_str(), nullptr) : v.get<double>();
}
double F(const Json& a, const char* k) { return num(a.at(k)); }
bool B(const Json& a, const char* k) { return a.at(k).get<bool>(); }
std::vector<int64_t> IV(const Json& a, const char* k) { return a.at(k).get<std::vector<int64_t>>(); }
std::string S(const Json& a, const char* k) { return a.at(k).get<std::string>(); }
std::optional<double> OF(const Json& a, const char* k) {
  if (!a.contains(k) || a.at(k).is_null()) return std::nullopt;
  return num(a.at(k));
}
std::optional<int64_t> OI(const Json& a, const char* k) {
  if (!a.contains(k) || a.at(k).is_null()) return std::nullopt;
  return a.at(k).get<int64_t>();
}
DType D(const Json& a, const char* k) {
  const std::string s = S(a, k);
  for (DType t : {kFloat32, kFloat64, kInt64, kInt32, kBool})
    if (dtype_name(t) == s) return t;
  throw std::runtime_error("unknown dtype '" + s + "'");
}

Tensor bias_of(const Ins& in) { return in.size() > 2 ? in[2] : Tensor(); }

template <typename F1>
DiffOp unary(const char* name, F1 f) {
  return {name, [f](const Ins& in, const Json&) { return Outs{f(in.at(0))}; }};
}
template <typename F2>
DiffOp binary(const char* name, F2 f) {
  return {name, [f](const Ins& in, const Json&) { return Outs{f(in.at(0), in.at(1))}; }};
}
// x op s, or s op x when "reverse" is set, through the C++ operators a user writes.
template <typename F2, typename F3>
DiffOp scalar_op(const char* name, F2 fwd, F3 rev) {
  return {name, [fwd, rev](const Ins& in, const Json& a) {
            const double s = F(a, "scalar");
            return Outs{B(a, "reverse") ? rev(s, in.at(0)) : fwd(in.at(0), s)};
          }};
}
template <typename FR>
DiffOp reduction(const char* name, FR f) {
  return {name, [f](const Ins& in, const Json& a) { return Outs{f(in.at(0), IV(a, "axes"), B(a, "keepdim"))}; }};
}

}  // namespace

OpTable builtin_ops() {
  OpTable t;
  // ---- unary ----
  t["neg"] = unary("neg", [](const Tensor& x) { return neg(x); });
  t["abs"] = unary("abs", [](const Tensor& x) { return abs(x); });
  t["exp"] = unary("exp", [](const Tensor& x) { return exp(x); });
  t["log"] = unary("log", [](const Tensor& x) { return log(x); });
  t["log1p"] = unary("log1p", [](const Tensor& x) { return log1p(x); });
  t["expm1"] = unary("expm1", [](const Tensor& x) { return expm1(x); });
  t["sqrt"] = unary("sqrt", [](const Tensor& x) { return sqrt(x); });
  t["rsqrt"] = unary("rsqrt", [](const Tensor& x) { return rsqrt(x); });
  t["square"] = unary("square", [](const Tensor& x) { return square(x); });
  t["reciprocal"] = unary("reciprocal", [](const Tensor& x) { return reciprocal(x); });
  t["sin"] = unary("sin", [](const Tensor& x) { return sin(x); });
  t["cos"] = unary("cos", [](const Tensor& x) { return cos(x); });
  t["tanh"] = unary("tanh", [](const Tensor& x) { return tanh(x); });
  t["sigmoid"] = unary("sigmoid", [](const Tensor& x) { return sigmoid(x); });
  t["relu"] = unary("relu", [](const Tensor& x) { return relu(x); });
  t["silu"] = unary("silu", [](const Tensor& x) { return silu(x); });
  t["hardswish"] = unary("hardswish", [](const Tensor& x) { return hardswish(x); });
  t["softplus"] = unary("softplus", [](const Tensor& x) { return softplus(x); });
  t["erf"] = unary("erf", [](const Tensor& x) { return erf(x); });
  t["asin"] = unary("asin", [](const Tensor& x) { return asin(x); });
  t["acos"] = unary("acos", [](const Tensor& x) { return acos(x); });
  t["atan"] = unary("atan", [](const Tensor& x) { return atan(x); });
  t["sign"] = unary("sign", [](const Tensor& x) { return sign(x); });
  t["floor"] = unary("floor", [](const Tensor& x) { return floor(x); });
  t["ceil"] = unary("ceil", [](const Tensor& x) { return ceil(x); });
  t["round"] = unary("round", [](const Tensor& x) { return round(x); });
  t["logical_not"] = unary("logical_not", [](const Tensor& x) { return logical_not(x); });
  t["isnan"] = unary("isnan", [](const Tensor& x) { return isnan(x); });
  t["leaky_relu"] = {"leaky_relu",
                     [](const Ins& in, const Json& a) { return Outs{leaky_relu(in.at(0), F(a, "negative_slope"))}; }};
  t["elu"] = {"elu", [](const Ins& in, const Json& a) { return Outs{elu(in.at(0), F(a, "alpha"))}; }};
  t["hardsigmoid"] = {"hardsigmoid", [](const Ins& in, const Json& a) {
                        return Outs{hardsigmoid(in.at(0), F(a, "alpha"), F(a, "beta"))};
                      }};
  t["gelu"] = {"gelu", [](const Ins& in, const Json& a) { return Outs{gelu(in.at(0), S(a, "approximate"))}; }};
  t["pow_scalar"] = {"pow", [](const Ins& in, const Json& a) { return Outs{pow(in.at(0), F(a, "exponent"))}; }};
  t["clamp"] = {"clamp",
                [](const Ins& in, const Json& a) { return Outs{clamp(in.at(0), OF(a, "min"), OF(a, "max"))}; }};

  // ---- binary ----
  t["add"] = {"add", [](const Ins& in, const Json& a) {
                return Outs{add(in.at(0), in.at(1), (a.contains("alpha") ? F(a, "alpha") : 1.0))};
              }};
  t["sub"] = {"sub", [](const Ins& in, const Json& a) {
                return Outs{sub(in.at(0), in.at(1), (a.contains("alpha") ? F(a, "alpha") : 1.0))};
              }};
  t["mul"] = binary("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
  t["div"] = binary("div", [](const Tensor& a, const Tensor& b) { return div(a, b); });
  t["pow"] = binary("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); });
  t["maximum"] = binary("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  t["minimum"] = binary("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  t["eq"] = binary("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); });
  t["ne"] = binary("ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); });
  t["lt"] = binary("lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); });
  t["le"] = binary("le", [](const Tensor& a, const Tensor& b) { return le(a, b); });
  t["gt"] = binary("gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); });
  t["ge"] = binary("ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); });
  t["logical_and"] = binary("logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); });
  t["logical_or"] = binary("logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); });
  t["logical_xor"] = binary("logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); });
  t["add_scalar"] = scalar_op(
      "add", [](const Tensor& x, double s) { return x + s; }, [](double s, const Tensor& x) { return s + x; });
  t["sub_scalar"] = scalar_op(
      "sub", [](const Tensor& x, double s) { return x - s; }, [](double s, const Tensor& x) { return s - x; });
  t["mul_scalar"] = scalar_op(
      "mul", [](const Tensor& x, double s) { return x * s; }, [](double s, const Tensor& x) { return s * x; });
  t["div_scalar"] = scalar_op(
      "div", [](const Tensor& x, double s) { return x / s; }, [](double s, const Tensor& x) { return s / x; });
  t["where"] = {"where", [](const Ins& in, const Json&) { return Outs{where(in.at(0), in.at(1), in.at(2))}; }};

  // ---- reductions ----
  t["sum"] = reduction("sum", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return sum(x, ax, k); });
  t["mean"] = reduction("mean", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return mean(x, ax, k); });
  t["prod"] = reduction("prod", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return prod(x, ax, k); });
  t["amax"] = reduction("amax", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return amax(x, ax, k); });
  t["amin"] = reduction("amin", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return amin(x, ax, k); });
  t["logsumexp"] = reduction(
      "logsumexp", [](const Tensor& x, const std::vector<int64_t>& ax, bool k) { return logsumexp(x, ax, k); });
  t["argmax"] = {"argmax",
                 [](const Ins& in, const Json& a) { return Outs{argmax(in.at(0), I(a, "axis"), B(a, "keepdim"))}; }};
  t["argmin"] = {"argmin",
                 [](const Ins& in, const Json& a) { return Outs{argmin(in.at(0), I(a, "axis"), B(a, "keepdim"))}; }};
  t["var"] = {"var", [](const Ins& in, const Json& a) {
                return Outs{var(in.at(0), IV(a, "axes"), I(a, "correction"), B(a, "keepdim"))};
              }};
  t["std"] = {"var", [](const Ins& in, const Json& a) {  // std is sqrt(var): its checks name var
                return Outs{braid::std(in.at(0), IV(a, "axes"), I(a, "correction"), B(a, "keepdim"))};
              }};
  t["softmax"] = {"softmax", [](const Ins& in, const Json& a) { return Outs{softmax(in.at(0), I(a, "axis"))}; }};
  t["log_softmax"] = {"log_softmax",
                      [](const Ins& in, const Json& a) { return Outs{log_softmax(in.at(0), I(a, "axis"))}; }};
  t["sum_to"] = {"sum_to", [](const Ins& in, const Json& a) { return Outs{sum_to(in.at(0), IV(a, "shape"))}; }};
  t["matmul"] = binary("matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });

  // ---- shape and indexing ----
  t["reshape"] = {"reshape", [](const Ins& in, const Json& a) { return Outs{reshape(in.at(0), IV(a, "shape"))}; }};
  t["permute"] = {"permute", [](const Ins& in, const Json& a) { return Outs{permute(in.at(0), IV(a, "order"))}; }};
  t["transpose"] = {"transpose",
                    [](const Ins& in, const Json& a) { return Outs{transpose(in.at(0), I(a, "a"), I(a, "b"))}; }};
  t["narrow"] = {"narrow", [](const Ins& in, const Json& a) {
                   return Outs{narrow(in.at(0), I(a, "axis"), I(a, "start"), I(a, "length"))};
                 }};
  t["slice"] = {"slice", [](const Ins& in, const Json& a) {
                  return Outs{slice(in.at(0), I(a, "axis"), I(a, "start"), I(a, "end"), I(a, "step"))};
                }};
  t["expand"] = {"expand", [](const Ins& in, const Json& a) { return Outs{expand(in.at(0), IV(a, "shape"))}; }};
  t["squeeze"] = {"squeeze", [](const Ins& in, const Json& a) { return Outs{squeeze(in.at(0), OI(a, "axis"))}; }};
  t["unsqueeze"] = {"unsqueeze", [](const Ins& in, const Json& a) { return Outs{unsqueeze(in.at(0), I(a, "axis"))}; }};
  t["flatten"] = {"flatten",
                  [](const Ins& in, const Json& a) { return Outs{flatten(in.at(0), I(a, "start"), I(a, "end"))}; }};
  t["contiguous"] = unary("contiguous", [](const Tensor& x) { return contiguous(x); });
  t["cast"] = {"cast", [](const Ins& in, const Json& a) { return Outs{cast(in.at(0), D(a, "dtype"))}; }};
  t["select"] = {"select",
                 [](const Ins& in, const Json& a) { return Outs{in.at(0).select(I(a, "axis"), I(a, "index"))}; }};
  t["concat"] = {"concat", [](const Ins& in, const Json& a) { return Outs{concat(in, I(a, "axis"))}; }};
  t["stack"] = {"stack", [](const Ins& in, const Json& a) { return Outs{stack(in, I(a, "axis"))}; }};
  t["split"] = {"split", [](const Ins& in, const Json& a) { return split(in.at(0), IV(a, "sizes"), I(a, "axis")); }};
  t["chunk"] = {"chunk", [](const Ins& in, const Json& a) { return chunk(in.at(0), I(a, "n"), I(a, "axis")); }};
  t["gather"] = {"gather", [](const Ins& in, const Json& a) { return Outs{gather(in.at(0), I(a, "axis"), in.at(1))}; }};
  t["index_select"] = {"index_select", [](const Ins& in, const Json& a) {
                         return Outs{index_select(in.at(0), I(a, "axis"), in.at(1))};
                       }};
  t["scatter_add"] = {"scatter_add", [](const Ins& in, const Json& a) {
                        return Outs{scatter_add(in.at(0), I(a, "axis"), in.at(1), in.at(2))};
                      }};
  t["pad"] = {"pad", [](const Ins& in, const Json& a) {
                return Outs{pad(in.at(0), IV(a, "pads"), S(a, "mode"), (a.contains("value") ? F(a, "value") : 0.0))};
              }};
  t["one_hot"] = {"one_hot", [](const Ins& in, const Json& a) { return Outs{one_hot(in.at(0), I(a, "num_classes"))}; }};
  t["tril"] = {"tril", [](const Ins& in, const Json& a) { return Outs{tril(in.at(0), I(a, "diagonal"))}; }};
  t["triu"] = {"triu", [](const Ins& in, const Json& a) { return Outs{triu(in.at(0), I(a, "diagonal"))}; }};

  // ---- convolution and pooling (conv.h); the bias is the optional third input ----
  t["conv1d"] = {"conv1d", [](const Ins& in, const Json& a) {
                   return Outs{conv1d(in.at(0), in.at(1), bias_of(in), I(a, "stride"), I(a, "padding"),
                                      I(a, "dilation"), I(a, "groups"))};
                 }};
  t["conv2d"] = {"conv2d", [](const Ins& in, const Json& a) {
                   return Outs{conv2d(in.at(0), in.at(1), bias_of(in), IV(a, "stride"), IV(a, "padding"),
                                      IV(a, "dilation"), I(a, "groups"))};
                 }};
  t["conv_transpose2d"] = {
      "conv_transpose2d", [](const Ins& in, const Json& a) {
        return Outs{conv_transpose2d(in.at(0), in.at(1), bias_of(in), IV(a, "stride"), IV(a, "padding"),
                                     IV(a, "output_padding"), I(a, "groups"), IV(a, "dilation"))};
      }};
  t["max_pool2d"] = {"max_pool2d", [](const Ins& in, const Json& a) {
                       return Outs{max_pool2d(in.at(0), IV(a, "kernel"), IV(a, "stride"), IV(a, "padding"),
                                              IV(a, "dilation"), B(a, "ceil_mode"))};
                     }};
  t["avg_pool2d"] = {"avg_pool2d", [](const Ins& in, const Json& a) {
                       return Outs{avg_pool2d(in.at(0), IV(a, "kernel"), IV(a, "stride"), IV(a, "padding"),
                                              B(a, "ceil_mode"), B(a, "count_include_pad"))};
                     }};
  t["adaptive_avg_pool2d"] = {"adaptive_avg_pool2d", [](const Ins& in, const Json& a) {
                                return Outs{adaptive_avg_pool2d(in.at(0), IV(a, "output_size"))};
                              }};

  // ---- whole-tensor comparisons: the bool answer as a 0-d tensor ----
  t["allclose"] = {"allclose", [](const Ins& in, const Json& a) {
                     return Outs{scalar_tensor(allclose(in.at(0), in.at(1), F(a, "rtol"), F(a, "atol")), kBool)};
                   }};
  t["equal"] = binary("equal", [](const Tensor& a, const Tensor& b) { return scalar_tensor(equal(a, b), kBool); });

  // ---- in-place updates: the result is the first input (the case's view) afterwards ----
  t["fill_"] = {"fill_", [](const Ins& in, const Json& a) {
                  Tensor x = in.at(0);
                  x.fill_(F(a, "value"));
                  return Outs{x};
                }};
  t["add_"] = {"add_", [](const Ins& in, const Json& a) {
                 Tensor x = in.at(0);
                 x.add_(in.at(1), a.contains("alpha") ? F(a, "alpha") : 1.0);
                 return Outs{x};
               }};
  t["mul_"] = {"mul_", [](const Ins& in, const Json& a) {
                 Tensor x = in.at(0);
                 x.mul_(F(a, "value"));
                 return Outs{x};
               }};
  t["copy_"] = {"copy_", [](const Ins& in, const Json&) {
                  Tensor x = in.at(0);
                  x.copy_(in.at(1));
                  return Outs{x};
                }};

  // ---- creation ----
  t["full"] = {"full",
               [](const Ins&, const Json& a) { return Outs{full(IV(a, "shape"), F(a, "value"), D(a, "dtype"))}; }};
  t["arange"] = {"arange", [](const Ins&, const Json& a) {
                   return Outs{arange(F(a, "start"), F(a, "end"), F(a, "step"), D(a, "dtype"))};
                 }};
  t["linspace"] = {"linspace", [](const Ins&, const Json& a) {
                     return Outs{linspace(F(a, "start"), F(a, "end"), I(a, "steps"), D(a, "dtype"))};
                   }};
  t["eye"] = {"eye", [](const Ins&, const Json& a) { return Outs{eye(I(a, "n"), D(a, "dtype"))}; }};
  return t;
}

}  // namespace braid::diff
