// The global gradient norm and clipping (train/grad_norm.h), including a stage that holds no
// parameter or no gradient (a pipeline stage of parameter-free nodes still clips).
#include "torch_test.h"

#include <cmath>
#include <vector>

#include "train/grad_norm.h"

using namespace dawnpiper;

TEST_CASE("clipping scales the gradients to the norm, and a stage without gradients clips nothing",
          "[train][grad_norm]") {
  at::Tensor a = at::ones({3}, at::kFloat).requires_grad_(true), b = at::ones({2, 2}, at::kFloat).requires_grad_(true);
  a.mutable_grad() = at::full({3}, 2.0);
  b.mutable_grad() = at::full({2, 2}, 1.0);
  const std::vector<at::Tensor> params = {a, b};
  const double norm = std::sqrt(grad_square_sum(params));
  REQUIRE(norm == Approx(std::sqrt(3 * 4.0 + 4 * 1.0)));
  const double factor = clip_grads(params, norm, 1.0);
  REQUIRE(factor == Approx(1.0 / (norm + 1e-6)));
  REQUIRE(std::sqrt(grad_square_sum(params)) == Approx(1.0).epsilon(1e-5));
  // No parameters, or none with a gradient: the factor, and nothing to scale.
  REQUIRE(grad_square_sum({}) == 0);
  REQUIRE(clip_grads({}, 5.0, 1.0) == Approx(1.0 / (5.0 + 1e-6)));
  at::Tensor c = at::ones({4}, at::kFloat).requires_grad_(true);
  REQUIRE_NOTHROW(clip_grads({c}, 5.0, 1.0));
  REQUIRE_FALSE(c.grad().defined());
}
