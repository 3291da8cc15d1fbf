// Placeholder for the `pallas` command-line tool (to be replaced by the real CLI).
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("usage: pallas [--help]\n");
    return 0;
  }
  std::fprintf(stderr, "usage: pallas [--help]\n");
  return argc > 1 ? 2 : 0;
}
