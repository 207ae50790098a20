// Pipeline schedules: GPipe, 1F1B, interleaved 1F1B and ZB-H1 as lists of actions per stage, and
// validate(), which checks a schedule's structure and then simulates it (receives block until the
// matching send has run) to prove it completes and to measure its bubble and peak live activations.
#include "braid/distributed/schedule.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "braid/error.h"

namespace braid::distributed {

using Kind = PipeAction::Kind;

std::string PipeAction::str() const {
  // A stream rather than "F" + std::to_string(m): GCC 12 warns falsely (-Wrestrict) on the latter.
  std::ostringstream os;
  switch (kind) {
    case Kind::Forward: os << "F" << micro; break;
    case Kind::Backward: os << "B" << micro; break;
    case Kind::BackwardInput:
      os << "BI" << micro;
      break;
    case Kind::BackwardWeight:
      os << "W" << micro;
      break;
    case Kind::SendActivation: os << "send_act " << micro; break;
    case Kind::RecvActivation: os << "recv_act " << micro; break;
    case Kind::SendGrad: os << "send_grad " << micro; break;
    case Kind::RecvGrad: os << "recv_grad " << micro; break;
    case Kind::Update: os << "update"; break;
  }
  if (chunk != 0) os << " chunk " << chunk;
  return os.str();
}

namespace {

void check_shape(int stages, int micro_batches, const char* who) {
  BRAID_CHECK(stages >= 1, who, ": stages must be at least 1, got ", stages);
  BRAID_CHECK(micro_batches >= 1, who, ": micro_batches must be at least 1, got ", micro_batches);
}

// The actions of one forward or backward of micro-batch m through chunk c of stage s, with the
// transfers around it; vs = c * k + s is the virtual stage, of v_count in all.
struct Builder {
  int k, v_count;
  std::vector<PipeAction>* a;
  int s;
  void forward(int m, int c = 0) const {
    const int vs = c * k + s;
    if (vs > 0) a->push_back({Kind::RecvActivation, m, c});
    a->push_back({Kind::Forward, m, c});
    if (vs < v_count - 1) a->push_back({Kind::SendActivation, m, c});
  }
  void backward(int m, int c = 0, Kind kind = Kind::Backward) const {
    const int vs = c * k + s;
    if (vs < v_count - 1) a->push_back({Kind::RecvGrad, m, c});
    a->push_back({kind, m, c});
    if (vs > 0) a->push_back({Kind::SendGrad, m, c});
  }
};

PipeSchedule empty_schedule(const char* name, int stages, int micro_batches, int chunks = 1) {
  return {name, stages, micro_batches, std::vector<std::vector<PipeAction>>(static_cast<size_t>(stages)), chunks};
}

}  // namespace

PipeSchedule gpipe_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches, "gpipe_schedule");
  PipeSchedule p = empty_schedule("GPipe", stages, micro_batches);
  for (int s = 0; s < stages; ++s) {
    const Builder b{stages, stages, &p.actions[static_cast<size_t>(s)], s};
    for (int m = 0; m < micro_batches; ++m) b.forward(m);
    for (int m = micro_batches - 1; m >= 0; --m) b.backward(m);
    b.a->push_back({Kind::Update, -1});
  }
  return p;
}

PipeSchedule one_f_one_b_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches, "one_f_one_b_schedule");
  PipeSchedule p = empty_schedule("1F1B", stages, micro_batches);
  for (int s = 0; s < stages; ++s) {
    const Builder b{stages, stages, &p.actions[static_cast<size_t>(s)], s};
    const int warm = std::min(stages - s - 1, micro_batches);
    for (int m = 0; m < warm; ++m) b.forward(m);
    for (int i = 0; i < micro_batches - warm; ++i) {
      b.forward(warm + i);
      b.backward(i);
    }
    for (int m = micro_batches - warm; m < micro_batches; ++m) b.backward(m);
    b.a->push_back({Kind::Update, -1});
  }
  return p;
}

// Note [Interleaved 1F1B]
// Megatron-LM's order (schedules.py, forward_backward_pipelining_with_interleaving). A rank runs
// v M chunk-forwards and as many chunk-backwards; the j-th of them belongs to group j / (K v) of K
// micro-batches, to micro-batch (j / (K v)) K + j % K and to chunk (j % (K v)) / K (backwards take
// the chunks in reverse, v - 1 - that). Rank s first runs 2 (K - s - 1) + (v - 1) K warm-up
// forwards (at most v M), then alternates one forward and one backward, then drains. Rank s thus
// holds at most min(v M, 2 (K - s - 1) + (v - 1) K + 1) chunk activations, each 1/v of a stage's:
// rank 0 holds (1 + 1/v) K - 1/v stages' worth against 1F1B's K. With a chunk's forward costing
// f / v and backward b / v, the makespan is M (f + b) + (K - 1)(f + b) / v, so the bubble over the
// ideal time is (K - 1) / (v M) and the idle share (K - 1) / (v M + K - 1); tests/test_schedule.cpp
// checks both exactly. Groups of K micro-batches are why M % K == 0 is required.
PipeSchedule interleaved_schedule(int stages, int micro_batches, int chunks) {
  check_shape(stages, micro_batches, "interleaved_schedule");
  BRAID_CHECK(chunks >= 2, "interleaved_schedule: chunks (model chunks per stage) must be at least 2, got ", chunks,
              "; one chunk per stage is one_f_one_b_schedule");
  BRAID_CHECK(micro_batches % stages == 0, "interleaved_schedule: micro_batches (", micro_batches,
              ") must be a multiple of stages (", stages, "), as Megatron-LM's interleaved schedule runs micro-batches",
              " in groups of one per stage; try ", (micro_batches / stages + 1) * stages);
  PipeSchedule p = empty_schedule("interleaved 1F1B", stages, micro_batches, chunks);
  const int k = stages, v = chunks, total = micro_batches * chunks;
  auto micro = [&](int j) { return (j / (k * v)) * k + j % k; };
  auto chunk = [&](int j, bool forward) {
    const int c = (j % (k * v)) / k;
    return forward ? c : v - 1 - c;
  };
  for (int s = 0; s < k; ++s) {
    const Builder b{k, k * v, &p.actions[static_cast<size_t>(s)], s};
    const int warm = std::min(2 * (k - s - 1) + (v - 1) * k, total);
    for (int j = 0; j < warm; ++j) b.forward(micro(j), chunk(j, true));
    for (int j = 0; j < total - warm; ++j) {
      b.forward(micro(warm + j), chunk(warm + j, true));
      b.backward(micro(j), chunk(j, false));
    }
    for (int j = total - warm; j < total; ++j) b.backward(micro(j), chunk(j, false));
    b.a->push_back({Kind::Update, -1});
  }
  return p;
}

// Note [ZB-H1]
// The handcrafted schedule of the zero-bubble paper (arXiv 2401.10241, section 3.1). Stage s runs
// K - s warm-up forwards; then s rounds of (BI, F) without a W; then rounds of (BI, W, F) until
// every micro-batch has been forwarded; then the remaining (BI, W); then the s W left over.
// BackwardInput alone is on the critical path, so gradients travel upstream at one unit per stage
// and the late W fill the tail that 1F1B leaves idle. With F = B = W = 1 every stage idles K - 1
// units (s before its first forward, K - 1 - s before its first BI), against 1F1B's 3 (K - 1):
// makespan 3 M + K - 1, bubble over ideal (K - 1) / (3 M), idle share (K - 1) / (3 M + K - 1).
// The W run in micro-batch order, s behind the BI (the paper's figure defers micro-batches 0..s-1
// instead, with the same timing): each parameter's gradient is then summed over micro-batches in
// 1F1B's order, so the two schedules give bitwise equal gradients. Memory: at most K - s
// activations await their input gradient on stage s, as in 1F1B; counted until W, every stage
// holds K, which is 1F1B's peak (stage 0's) -- the paper's "same peak memory as 1F1B" is per
// pipeline, not per stage.
PipeSchedule zb_h1_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches, "zb_h1_schedule");
  BRAID_CHECK(micro_batches >= stages, "zb_h1_schedule: micro_batches (", micro_batches, ") must be at least stages (",
              stages, "): ZB-H1 fills K - s warm-up forwards on stage s");
  PipeSchedule p = empty_schedule("ZB-H1", stages, micro_batches);
  const int k = stages;
  for (int s = 0; s < k; ++s) {
    const Builder b{k, k, &p.actions[static_cast<size_t>(s)], s};
    int f = 0, g = 0, w = 0;  // next micro-batch to forward, to BI, to W
    auto weight = [&] { b.a->push_back({Kind::BackwardWeight, w++}); };
    for (; f < k - s; ++f) b.forward(f);
    for (int i = 0; i < s; ++i) {
      b.backward(g++, 0, Kind::BackwardInput);
      b.forward(f++);
    }
    while (f < micro_batches) {
      b.backward(g++, 0, Kind::BackwardInput);
      weight();
      b.forward(f++);
    }
    while (g < micro_batches) {
      b.backward(g++, 0, Kind::BackwardInput);
      weight();
    }
    while (w < micro_batches) weight();
    b.a->push_back({Kind::Update, -1});
  }
  return p;
}

PipeSchedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks) {
  if (name == "gpipe") return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, micro_batches);
  if (name == "interleaved") return interleaved_schedule(stages, micro_batches, chunks);
  if (name == "zb-h1") return zb_h1_schedule(stages, micro_batches);
  throw ValueError(
      ::braid::detail::cat("make_schedule: unknown schedule '", name, "'; known: gpipe, 1f1b, interleaved, zb-h1"));
}

namespace {

std::string where(const PipeSchedule& p, int s, size_t i, const PipeAction& a) {
  std::string what = a.str();
  if (p.chunks > 1 && a.chunk == 0 && a.kind != Kind::Update) what += " chunk 0";
  return ::braid::detail::cat("stage ", s, ": ", what, " (action ", i, ")");
}

std::string name_of(const PipeSchedule& p, Kind kind, int m, int c) {
  std::string what = PipeAction{kind, m, c}.str();
  if (p.chunks > 1 && c == 0) what += " chunk 0";
  return what;
}

bool is_receive(Kind k) { return k == Kind::RecvActivation || k == Kind::RecvGrad; }
bool is_send(Kind k) { return k == Kind::SendActivation || k == Kind::SendGrad; }

// Each stage must, for every chunk and micro-batch, forward once and backward once (Backward, or
// BackwardInput then BackwardWeight), receive what it consumes before it consumes it, send what it
// produces after producing it, and update last. Virtual stage vs = c * K + s receives from vs - 1
// and sends to vs + 1; since every virtual stage but the ends must send and receive each
// micro-batch once and nothing may appear twice, every send then has exactly one matching receive
// on the neighbouring stage, the last rank's chunk c sending to rank 0's chunk c + 1.
void check_structure(const PipeSchedule& p) {
  const int k = p.stages, m_count = p.micro_batches, v = p.chunks, v_count = k * v;
  BRAID_CHECK(k >= 1 && m_count >= 1 && v >= 1, "validate: schedule '", p.name, "' has ", k, " stages, ", m_count,
              " micro-batches and ", v, " chunks; each must be at least 1");
  BRAID_CHECK(static_cast<int>(p.actions.size()) == k, "validate: schedule '", p.name, "' has ", p.actions.size(),
              " action lists for ", k, " stages");
  for (int s = 0; s < k; ++s) {
    const auto& a = p.actions[static_cast<size_t>(s)];
    std::map<std::tuple<Kind, int, int>, size_t> at;  // position of (kind, micro, chunk)
    for (size_t i = 0; i < a.size(); ++i) {
      const PipeAction& x = a[i];
      if (x.kind == Kind::Update) {
        BRAID_CHECK(i + 1 == a.size(), "validate: ", where(p, s, i, x), " must be the stage's last action");
        continue;
      }
      BRAID_CHECK(x.micro >= 0 && x.micro < m_count, "validate: ", where(p, s, i, x), " names micro-batch ", x.micro,
                  " of ", m_count);
      BRAID_CHECK(x.chunk >= 0 && x.chunk < v, "validate: ", where(p, s, i, x), " names chunk ", x.chunk, " of ", v);
      const int vs = x.chunk * k + s;
      const char* first = v == 1 ? "the first stage has no previous stage" : "it is virtual stage 0, the model's first";
      const char* last = v == 1 ? "the last stage has no next stage" : "it is the model's last virtual stage";
      BRAID_CHECK(!(vs == 0 && (x.kind == Kind::RecvActivation || x.kind == Kind::SendGrad)),
                  "validate: ", where(p, s, i, x), ": ", first);
      BRAID_CHECK(!(vs == v_count - 1 && (x.kind == Kind::SendActivation || x.kind == Kind::RecvGrad)),
                  "validate: ", where(p, s, i, x), ": ", last);
      BRAID_CHECK(at.emplace(std::make_tuple(x.kind, x.micro, x.chunk), i).second, "validate: ", where(p, s, i, x),
                  " appears twice");
    }
    BRAID_CHECK(!a.empty() && a.back().kind == Kind::Update, "validate: stage ", s, " of '", p.name,
                "' does not end with update");
    for (int c = 0; c < v; ++c) {
      const int vs = c * k + s;
      auto pos = [&](Kind kind, int m) {
        auto it = at.find({kind, m, c});
        return it == at.end() ? -1L : static_cast<long>(it->second);
      };
      auto here = [&](Kind kind, int m, long i) { return where(p, s, static_cast<size_t>(i), {kind, m, c}); };
      for (int m = 0; m < m_count; ++m) {
        const long f = pos(Kind::Forward, m), whole = pos(Kind::Backward, m);
        const long bi = pos(Kind::BackwardInput, m), w = pos(Kind::BackwardWeight, m);
        BRAID_CHECK(f >= 0, "validate: stage ", s, " never runs ", name_of(p, Kind::Forward, m, c));
        BRAID_CHECK(whole >= 0 || bi >= 0, "validate: stage ", s, " never runs ", name_of(p, Kind::Backward, m, c),
                    " (or its split ", name_of(p, Kind::BackwardInput, m, c), " and W)");
        BRAID_CHECK(whole < 0 || (bi < 0 && w < 0), "validate: ", here(Kind::Backward, m, whole),
                    " runs the whole backward, and the split one too");
        BRAID_CHECK(bi < 0 || w >= 0, "validate: ", here(Kind::BackwardInput, m, bi), " is never followed by ",
                    name_of(p, Kind::BackwardWeight, m, c), ": the weight gradients would be lost");
        BRAID_CHECK(w < 0 || bi >= 0, "validate: ", here(Kind::BackwardWeight, m, w), " has no ",
                    name_of(p, Kind::BackwardInput, m, c));
        BRAID_CHECK(bi < 0 || bi < w, "validate: ", here(Kind::BackwardWeight, m, w), " comes before ",
                    name_of(p, Kind::BackwardInput, m, c));
        const Kind bk = whole >= 0 ? Kind::Backward : Kind::BackwardInput;
        const long b = whole >= 0 ? whole : bi;  // the action that makes the input gradient
        BRAID_CHECK(f < b, "validate: ", here(bk, m, b), " comes before ", name_of(p, Kind::Forward, m, c));
        if (vs > 0) {
          const long r = pos(Kind::RecvActivation, m), g = pos(Kind::SendGrad, m);
          BRAID_CHECK(r >= 0 && r < f, "validate: ", here(Kind::Forward, m, f), " has no ",
                      name_of(p, Kind::RecvActivation, m, c), " before it");
          BRAID_CHECK(g > b, "validate: ", here(bk, m, b), " has no ", name_of(p, Kind::SendGrad, m, c), " after it");
        }
        if (vs < v_count - 1) {
          const long sa = pos(Kind::SendActivation, m), r = pos(Kind::RecvGrad, m);
          BRAID_CHECK(sa > f, "validate: ", here(Kind::Forward, m, f), " has no ",
                      name_of(p, Kind::SendActivation, m, c), " after it");
          BRAID_CHECK(r >= 0 && r < b, "validate: ", here(bk, m, b), " has no ", name_of(p, Kind::RecvGrad, m, c),
                      " before it");
        }
      }
    }
  }
}

}  // namespace

ScheduleReport validate(const PipeSchedule& p, double backward_cost) {
  BRAID_CHECK(backward_cost > 0, "validate: backward_cost must be positive, got ", backward_cost);
  return validate(p, StepCosts{1.0, backward_cost, backward_cost / 2, backward_cost / 2});
}

ScheduleReport validate(const PipeSchedule& p, const StepCosts& costs) {
  BRAID_CHECK(costs.forward > 0 && costs.backward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
              "validate: every cost must be positive, got forward ", costs.forward, ", backward ", costs.backward,
              ", backward_input ", costs.backward_input, ", backward_weight ", costs.backward_weight);
  check_structure(p);
  const int k = p.stages;
  const double per_chunk = 1.0 / p.chunks;
  std::vector<size_t> pc(static_cast<size_t>(k), 0);
  std::vector<double> clock(static_cast<size_t>(k), 0.0);
  std::vector<int> live(static_cast<size_t>(k), 0), awaiting(static_cast<size_t>(k), 0);
  ScheduleReport r;
  r.peak_live_activations.assign(static_cast<size_t>(k), 0);
  r.peak_awaiting_input_grad.assign(static_cast<size_t>(k), 0);
  // (kind of the send, sending virtual stage, micro) -> time the data left.
  std::map<std::tuple<Kind, int, int>, double> sent;
  double busy = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < k; ++s) {
      const size_t su = static_cast<size_t>(s);
      const auto& a = p.actions[su];
      auto& i = pc[su];
      auto& t = clock[su];
      while (i < a.size()) {
        const PipeAction& x = a[i];
        const int vs = x.chunk * k + s;
        double cost = 0;
        if (is_receive(x.kind)) {
          const bool act = x.kind == Kind::RecvActivation;
          auto it = sent.find({act ? Kind::SendActivation : Kind::SendGrad, act ? vs - 1 : vs + 1, x.micro});
          if (it == sent.end()) break;  // blocked until the neighbour sends
          t = std::max(t, it->second);
        } else if (is_send(x.kind)) {
          sent[{x.kind, vs, x.micro}] = t;
        } else if (x.kind == Kind::Forward) {
          cost = costs.forward;
          r.peak_live_activations[su] = std::max(r.peak_live_activations[su], ++live[su]);
          r.peak_awaiting_input_grad[su] = std::max(r.peak_awaiting_input_grad[su], ++awaiting[su]);
        } else if (x.kind == Kind::Backward) {
          cost = costs.backward;
          --live[su];
          --awaiting[su];
        } else if (x.kind == Kind::BackwardInput) {
          cost = costs.backward_input;
          --awaiting[su];
        } else if (x.kind == Kind::BackwardWeight) {
          cost = costs.backward_weight;
          --live[su];
        }
        t += cost * per_chunk;
        busy += cost * per_chunk;
        ++i;
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  int n_stuck = 0;
  for (int s = 0; s < k; ++s) {
    const size_t i = pc[static_cast<size_t>(s)];
    const auto& a = p.actions[static_cast<size_t>(s)];
    if (i < a.size()) {
      const std::string w = where(p, s, i, a[i]);  // "stage s: X (action i)"
      stuck << (n_stuck++ ? "; " : "") << "stage " << s << " waits forever at " << w.substr(w.find(": ") + 2);
    }
  }
  BRAID_CHECK(n_stuck == 0, "validate: schedule '", p.name, "' deadlocks: ", stuck.str());
  r.makespan = *std::max_element(clock.begin(), clock.end());
  // Note [Exact bubble]
  // With costs that are sums of powers of two, the makespan, busy and idle time are exact, so each
  // ratio below is one correctly rounded division: equal to the double nearest the closed form,
  // which the tests compare with ==. (1 - busy / total would lose that to cancellation.)
  const double idle = k * r.makespan - busy;
  r.bubble_fraction = idle / (k * r.makespan);
  r.bubble_over_ideal = idle / busy;
  return r;
}

}  // namespace braid::distributed
