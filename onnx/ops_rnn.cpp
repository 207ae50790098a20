// ONNX recurrent ops (LSTM, GRU, RNN) as braid ops.
#include "ops_util.h"

namespace braid::onnx::ops {

void register_rnn_ops(OpRegistry&) {}

}  // namespace braid::onnx::ops
