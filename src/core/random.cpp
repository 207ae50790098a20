// The default generator that creation ops draw from when no Generator is passed.
#include "braid/random.h"

namespace braid {

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace braid
