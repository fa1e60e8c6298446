// What every rank learns from the one all-reduce after each backward: which
// stage's gradients are not finite, whether the loss is, the global gradient
// norm, and whether some rank was interrupted. Torch-free: the trainer
// fills the flags from its tensors and sums them over all ranks.
//
// Note [One collective per step's checks]: one float64 all-reduce carries,
// per stage, the squared norm of its gradients (not finite: a non-finite
// gradient there), the loss flag, and the squared global norm for
// optimizer.clip_grad_norm and the metrics. The global norm counts each
// gradient once: a tied group only on the first stage holding it (its
// copies hold the summed gradient), and only replica 0 (after the step
// every replica holds the averaged gradients). Each gradient's norm comes
// from one foreach norm over all of a rank's gradients, in their dtype, read
// back at once; a norm that is not finite is taken again in float64, so a
// large finite gradient never reads as an overflow. The same all-reduce
// carries, per stage, whether the previous step's update left non-finite
// parameters (Note [Non-finite steps]): that check needs no collective of
// its own, except before a checkpoint, an evaluation or the run's end,
// where the trainer settles it at once.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "stage/manifest.h"
#include "train/step_outcome.h"

namespace pipeforge::train {

struct GradientCheck {
  NonFinite bad;
  double norm = 0.0;       // the global gradient norm before clipping
  int interrupted_by = 0;  // SIGINT or SIGTERM when any rank was interrupted (Note [Graceful interrupts])
  int updated_nonfinite_stage = -1;  // the first stage the previous update left non-finite, or -1
};

// One rank's contribution to the all-reduce, and its sum decoded.
class GradientCheckFlags {
 public:
  explicit GradientCheckFlags(int num_stages);

  void addStageNorm2(int stage, double squared_norm);
  void addGlobalNorm2(double squared_norm);
  void markLossNonFinite();
  // This rank's interruptSignal(): SIGINT, SIGTERM, or 0 (none).
  void markInterrupted(int signal);
  // The previous update left parameters of `stage` non-finite on this rank.
  void markUpdateNonFinite(int stage);

  // The values the all-reduce sums, in place: [0, n) squared gradient norm
  // per stage; n: the loss is not finite; n + 1: squared global norm; n + 2,
  // n + 3: ranks interrupted by SIGINT, by SIGTERM; [n + 4, 2n + 4): the
  // previous update left stage s non-finite.
  std::vector<double>& values() { return values_; }

  // After the all-reduce: the same verdict on every rank.
  GradientCheck decode() const;

 private:
  int num_stages_;
  std::vector<double> values_;
};

// A parameter's name as PyTorch's named_parameters() lists it: for a tied
// group (pipe.json "tied", in the model's order), its first name; and the
// first stage holding each.
class TiedNames {
 public:
  explicit TiedNames(const stage::PipeManifest& manifest);

  const std::string& canonical(const std::string& name) const;
  // The first stage, in pipeline order, holding `name` or a name tied to it.
  int firstHolder(const std::string& name) const { return first_holder_.at(canonical(name)); }

 private:
  std::map<std::string, std::string> canonical_;  // tied name -> its group's first name
  std::map<std::string, int> first_holder_;       // canonical parameter name -> first stage holding it
};

}  // namespace pipeforge::train
