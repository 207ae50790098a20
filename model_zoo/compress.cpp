#include "compress.h"

#include <cstdlib>

namespace braid::zoo {

Compression parse_compression(const std::string& spec, int64_t warmup_steps) {
  using namespace distributed;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  char* end = nullptr;
  const double value = arg.empty() ? 0.0 : std::strtod(arg.c_str(), &end);
  const bool number = !arg.empty() && end != nullptr && *end == '\0' && value > 0;
  Compression c;
  c.description = spec;
  if (kind == "none" && arg.empty()) {
    c.description = "none (the all-reduce)";
  } else if ((kind == "fp16" || kind == "bf16") && arg.empty()) {
    c.wire = kind == "fp16" ? WireDType::Float16 : WireDType::BFloat16;
    c.description = "the all-reduce with " + kind + " on the wire";
  } else if ((kind == "topk" || kind == "dgc") && number && value <= 1) {
    TopKOptions o{.ratio = value};
    if (kind == "dgc") o.momentum = 0.9, o.clip_norm = 5.0, o.warmup_steps = warmup_steps, c.momentum_in_hook = true;
    c.hook = std::make_shared<TopKHook>(o);
    c.description = c.hook->name();
  } else if (kind == "powersgd" && number && value == static_cast<double>(static_cast<int64_t>(value))) {
    c.hook = std::make_shared<PowerSGDHook>(
        PowerSGDOptions{.rank = static_cast<int64_t>(value), .start_step = warmup_steps});
    c.description = c.hook->name();
  } else {
    throw ValueError("braid-train: --compress '" + spec +
                     "' is not one of none, fp16, bf16, topk:RATIO, dgc:RATIO (0 < RATIO <= 1) or powersgd:RANK");
  }
  return c;
}

}  // namespace braid::zoo
