// A oneDNN primitive that fails to run is reported as braid::Error naming what ran and the shape of
// every argument (src/backend/cpu/dnnl_common.h), never as oneDNN's own exception without shapes.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/dnnl_common.h"
#include "braid/error.h"

namespace {

using dnnl::memory;

TEST(OneDnnRun, AFailedRunNamesTheOpAndEveryArgumentsShape) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc md({2, 3, 5}, memory::data_type::f32, memory::format_tag::abc);
  const auto pd = dnnl::eltwise_forward::primitive_desc(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_relu, md), engine);
  const dnnl::eltwise_forward relu(pd);
  float x[30] = {}, y[30] = {}, w[4] = {};
  const memory src = braid::detail::unbound(md, engine), dst = braid::detail::unbound(md, engine);
  const memory weights =
      braid::detail::unbound(memory::desc({4}, memory::data_type::f32, memory::format_tag::a), engine);

  // The run that works: relu of (-1, 2, ...) into y.
  x[0] = -1.f;
  x[1] = 2.f;
  const dnnl_exec_arg_t ok[2] = {{DNNL_ARG_SRC, braid::detail::point(src, x)},
                                 {DNNL_ARG_DST, braid::detail::point(dst, y)}};
  braid::detail::run_primitive(relu, stream, ok, 2, "relu");
  stream.wait();
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 2.f);

  // No source, and an argument an eltwise primitive does not take: oneDNN counts the inputs and
  // refuses the run (invalid arguments).
  const dnnl_exec_arg_t bad[2] = {{DNNL_ARG_WEIGHTS, braid::detail::point(weights, w)},
                                  {DNNL_ARG_DST, braid::detail::point(dst, y)}};
  try {
    braid::detail::run_primitive(relu, stream, bad, 2, "relu");
    FAIL() << "the run without a source was accepted";
  } catch (const braid::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("relu: oneDNN could not run the primitive (invalid arguments"), std::string::npos) << what;
    EXPECT_NE(what.find("on weights 4, dst 2x3x5"), std::string::npos) << what;
  }
}

}  // namespace
