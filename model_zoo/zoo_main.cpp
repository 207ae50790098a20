// braid-zoo: the model zoo's catalogue from the command line.
//   braid-zoo list     every model: parameters, input, pretrained source, description, preprocessing
#include <cstdio>
#include <cstring>
#include <iostream>

#include "catalogue.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], "list") != 0) {
    std::fprintf(stderr, "usage: braid-zoo list\n");
    return argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) ? 0 : 2;
  }
  try {
    braid::zoo::print_catalogue(std::cout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-zoo: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
