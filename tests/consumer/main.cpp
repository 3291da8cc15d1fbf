// Uses the installed library: traces and evaluates a kernel, checks the result.
#include <pallas/pallas.h>

#include <iostream>

namespace pl = pallas;

int main() {
  auto k = pl::trace_kernel([](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] * 3.0f + 1.0f; },
                            {pl::ir::Type::ref({4}, pl::f32), pl::ir::Type::ref({4}, pl::f32)});
  std::vector<pl::Array> bufs = {pl::Array::from_values({4}, pl::f32, {0, 1, 2, 3}),
                                 pl::Array::zeros({4}, pl::f32)};
  pl::evaluate(k, bufs);
  std::vector<float> want = {1, 4, 7, 10};
  if (bufs[1].to_vector<float>() != want) {
    std::cerr << "consumer: wrong result " << bufs[1] << "\n";
    return 1;
  }
  std::cout << "consumer ok\n";
  return 0;
}
