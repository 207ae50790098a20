// braid::Event and the Backend's default events: a host timestamp taken once the device's work is
// complete, which is exact for backends that finish each primitive before returning (the CPU and
// the shadow device). A backend with a queue overrides all four methods with its own events.
#include <chrono>

#include "backend/backend.h"
#include "braid/error.h"

namespace braid {
namespace detail {

namespace {
struct TimestampEvent : BackendEvent {
  std::chrono::steady_clock::time_point at;
};

const TimestampEvent& as_timestamp(const BackendEvent& e) {
  const auto* t = dynamic_cast<const TimestampEvent*>(&e);
  BRAID_ASSERT(t != nullptr, "event: not an event of this backend");
  return *t;
}
}  // namespace

std::shared_ptr<BackendEvent> Backend::record_event(Device device) {
  synchronize(device);
  auto e = std::make_shared<TimestampEvent>();
  e->at = std::chrono::steady_clock::now();
  return e;
}

bool Backend::event_ready(const BackendEvent& event) {
  as_timestamp(event);
  return true;
}

void Backend::event_synchronize(const BackendEvent& event) { as_timestamp(event); }

double Backend::event_elapsed_ms(const BackendEvent& start, const BackendEvent& end) {
  return std::chrono::duration<double, std::milli>(as_timestamp(end).at - as_timestamp(start).at).count();
}

}  // namespace detail

Event Event::record(Device device) { return Event(device, detail::backend_for(device).record_event(device)); }

bool Event::ready() const { return detail::backend_for(device_).event_ready(*impl_); }

void Event::synchronize() const { detail::backend_for(device_).event_synchronize(*impl_); }

double Event::elapsed_ms(const Event& end) const {
  BRAID_CHECK_T(TypeError, end.device_ == device_, "Event::elapsed_ms: the events are on different devices (",
                device_.str(), " and ", end.device_.str(), ")");
  return detail::backend_for(device_).event_elapsed_ms(*impl_, *end.impl_);
}

}  // namespace braid
