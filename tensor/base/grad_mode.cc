#include "tensor/base/grad_mode.h"

namespace tandem {
namespace {
thread_local bool t_grad_mode_enabled = true;
}  // namespace

bool GradMode::IsEnabled() { return t_grad_mode_enabled; }
void GradMode::SetEnabled(bool enabled) { t_grad_mode_enabled = enabled; }

}  // namespace tandem
