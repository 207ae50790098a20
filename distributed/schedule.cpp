// Pipeline schedules: GPipe and 1F1B as lists of actions per stage, and validate(), which checks a
// schedule's structure and then simulates it (receives block until the matching send has run) to
// prove it completes and to measure its bubble and peak live activations.
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
    case Kind::SendActivation: os << "send_act " << micro; break;
    case Kind::RecvActivation: os << "recv_act " << micro; break;
    case Kind::SendGrad: os << "send_grad " << micro; break;
    case Kind::RecvGrad: os << "recv_grad " << micro; break;
    case Kind::Update: os << "update"; break;
  }
  return os.str();
}

namespace {

void check_shape(int stages, int micro_batches, const char* who) {
  BRAID_CHECK(stages >= 1, who, ": stages must be at least 1, got ", stages);
  BRAID_CHECK(micro_batches >= 1, who, ": micro_batches must be at least 1, got ", micro_batches);
}

void forward(std::vector<PipeAction>& a, int s, int k, int m) {
  if (s > 0) a.push_back({Kind::RecvActivation, m});
  a.push_back({Kind::Forward, m});
  if (s < k - 1) a.push_back({Kind::SendActivation, m});
}

void backward(std::vector<PipeAction>& a, int s, int k, int m) {
  if (s < k - 1) a.push_back({Kind::RecvGrad, m});
  a.push_back({Kind::Backward, m});
  if (s > 0) a.push_back({Kind::SendGrad, m});
}

}  // namespace

PipeSchedule gpipe_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches, "gpipe_schedule");
  PipeSchedule p{"GPipe", stages, micro_batches, std::vector<std::vector<PipeAction>>(static_cast<size_t>(stages))};
  for (int s = 0; s < stages; ++s) {
    auto& a = p.actions[static_cast<size_t>(s)];
    for (int m = 0; m < micro_batches; ++m) forward(a, s, stages, m);
    for (int m = micro_batches - 1; m >= 0; --m) backward(a, s, stages, m);
    a.push_back({Kind::Update, -1});
  }
  return p;
}

PipeSchedule one_f_one_b_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches, "one_f_one_b_schedule");
  PipeSchedule p{"1F1B", stages, micro_batches, std::vector<std::vector<PipeAction>>(static_cast<size_t>(stages))};
  for (int s = 0; s < stages; ++s) {
    auto& a = p.actions[static_cast<size_t>(s)];
    const int warm = std::min(stages - s - 1, micro_batches);
    for (int m = 0; m < warm; ++m) forward(a, s, stages, m);
    for (int i = 0; i < micro_batches - warm; ++i) {
      forward(a, s, stages, warm + i);
      backward(a, s, stages, i);
    }
    for (int m = micro_batches - warm; m < micro_batches; ++m) backward(a, s, stages, m);
    a.push_back({Kind::Update, -1});
  }
  return p;
}

namespace {

std::string where(int s, size_t i, const PipeAction& a) {
  return ::braid::detail::cat("stage ", s, ": ", a.str(), " (action ", i, ")");
}

// Each stage must forward and backward every micro-batch exactly once, receive what it consumes
// before it consumes it, send what it produces after producing it, and update last.
void check_structure(const PipeSchedule& p) {
  const int k = p.stages, m_count = p.micro_batches;
  BRAID_CHECK(static_cast<int>(p.actions.size()) == k, "validate: schedule '", p.name, "' has ", p.actions.size(),
              " action lists for ", k, " stages");
  for (int s = 0; s < k; ++s) {
    const auto& a = p.actions[static_cast<size_t>(s)];
    std::map<std::pair<Kind, int>, size_t> at;  // first position of (kind, micro)
    for (size_t i = 0; i < a.size(); ++i) {
      const PipeAction& x = a[i];
      if (x.kind == Kind::Update) {
        BRAID_CHECK(i + 1 == a.size(), "validate: ", where(s, i, x), " must be the stage's last action");
        continue;
      }
      BRAID_CHECK(x.micro >= 0 && x.micro < m_count, "validate: ", where(s, i, x), " names micro-batch ", x.micro,
                  " of ", m_count);
      BRAID_CHECK(!(s == 0 && (x.kind == Kind::RecvActivation || x.kind == Kind::SendGrad)), "validate: ",
                  where(s, i, x), ": the first stage has no previous stage");
      BRAID_CHECK(!(s == k - 1 && (x.kind == Kind::SendActivation || x.kind == Kind::RecvGrad)), "validate: ",
                  where(s, i, x), ": the last stage has no next stage");
      BRAID_CHECK(at.emplace(std::make_pair(x.kind, x.micro), i).second, "validate: ", where(s, i, x),
                  " appears twice");
    }
    BRAID_CHECK(!a.empty() && a.back().kind == Kind::Update, "validate: stage ", s, " of '", p.name,
                "' does not end with update");
    auto pos = [&](Kind kind, int m) {
      auto it = at.find({kind, m});
      return it == at.end() ? -1 : static_cast<long>(it->second);
    };
    for (int m = 0; m < m_count; ++m) {
      const long f = pos(Kind::Forward, m), b = pos(Kind::Backward, m);
      BRAID_CHECK(f >= 0, "validate: stage ", s, " never runs F", m);
      BRAID_CHECK(b >= 0, "validate: stage ", s, " never runs B", m);
      BRAID_CHECK(f < b, "validate: ", where(s, static_cast<size_t>(b), {Kind::Backward, m}), " comes before F", m);
      if (s > 0) {
        const long r = pos(Kind::RecvActivation, m), g = pos(Kind::SendGrad, m);
        BRAID_CHECK(r >= 0 && r < f, "validate: ", where(s, static_cast<size_t>(f), {Kind::Forward, m}),
                    " has no recv_act ", m, " before it");
        BRAID_CHECK(g > b, "validate: ", where(s, static_cast<size_t>(b), {Kind::Backward, m}), " has no send_grad ",
                    m, " after it");
      }
      if (s < k - 1) {
        const long sa = pos(Kind::SendActivation, m), r = pos(Kind::RecvGrad, m);
        BRAID_CHECK(sa > f, "validate: ", where(s, static_cast<size_t>(f), {Kind::Forward, m}), " has no send_act ",
                    m, " after it");
        BRAID_CHECK(r >= 0 && r < b, "validate: ", where(s, static_cast<size_t>(b), {Kind::Backward, m}),
                    " has no recv_grad ", m, " before it");
      }
    }
  }
}

}  // namespace

ScheduleReport validate(const PipeSchedule& p, double backward_cost) {
  BRAID_CHECK(backward_cost > 0, "validate: backward_cost must be positive, got ", backward_cost);
  check_structure(p);
  const int k = p.stages;
  std::vector<size_t> pc(static_cast<size_t>(k), 0);
  std::vector<double> clock(static_cast<size_t>(k), 0.0);
  std::vector<int> live(static_cast<size_t>(k), 0);
  ScheduleReport r;
  r.peak_live_activations.assign(static_cast<size_t>(k), 0);
  // (kind of the send, sending stage, micro) -> time the data left.
  std::map<std::tuple<Kind, int, int>, double> sent;
  double busy = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < k; ++s) {
      const auto& a = p.actions[static_cast<size_t>(s)];
      auto& i = pc[static_cast<size_t>(s)];
      auto& t = clock[static_cast<size_t>(s)];
      while (i < a.size()) {
        const PipeAction& x = a[i];
        if (x.kind == Kind::RecvActivation || x.kind == Kind::RecvGrad) {
          const bool act = x.kind == Kind::RecvActivation;
          auto it = sent.find({act ? Kind::SendActivation : Kind::SendGrad, act ? s - 1 : s + 1, x.micro});
          if (it == sent.end()) break;  // blocked until the neighbour sends
          t = std::max(t, it->second);
        } else if (x.kind == Kind::SendActivation || x.kind == Kind::SendGrad) {
          sent[{x.kind, s, x.micro}] = t;
        } else if (x.kind == Kind::Forward) {
          t += 1.0;
          busy += 1.0;
          int& l = live[static_cast<size_t>(s)];
          r.peak_live_activations[static_cast<size_t>(s)] = std::max(r.peak_live_activations[static_cast<size_t>(s)], ++l);
        } else if (x.kind == Kind::Backward) {
          t += backward_cost;
          busy += backward_cost;
          --live[static_cast<size_t>(s)];
        }
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
    if (i < a.size()) stuck << (n_stuck++ ? "; " : "") << "stage " << s << " waits forever at " << a[i].str()
                            << " (action " << i << ")";
  }
  BRAID_CHECK(n_stuck == 0, "validate: schedule '", p.name, "' deadlocks: ", stuck.str());
  r.makespan = *std::max_element(clock.begin(), clock.end());
  r.bubble_fraction = 1.0 - busy / (k * r.makespan);
  return r;
}

}  // namespace braid::distributed
