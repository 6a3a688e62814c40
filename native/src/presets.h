// presets.h: named model shapes and shape validation.
//
// The presets must equal bridge.Presets (bridge/presets.go) field for field and
// validate_shape applies the rules of ModelShape.Validate with the same
// messages; bridge/native tests compare the two sides.
#ifndef LOCKSTEP_NATIVE_PRESETS_H
#define LOCKSTEP_NATIVE_PRESETS_H

#include <string>

#include "engine.h"

namespace lockstep {

// Looks up a preset by name; false if unknown.
bool find_preset(const std::string& name, eng_model_shape* out);

// The preset names in sorted order, comma separated ("llama-70b, llama-8b, tiny").
std::string preset_names();

// Throws EngineError(ENG_INVALID_ARGUMENT) naming the first inconsistent field.
void validate_shape(const eng_model_shape& s);

// The KV cache of one token in one layer: planes (2: K and V; 1: an MLA
// latent) of kv_width floats each.
inline bool is_mla(const eng_model_shape& s) { return s.kv_lora_rank > 0; }
inline int32_t kv_planes(const eng_model_shape& s) { return is_mla(s) ? 1 : 2; }
inline int32_t kv_width(const eng_model_shape& s) {
  return is_mla(s) ? s.kv_lora_rank + s.qk_rope_head_dim : s.num_kv_heads * s.head_dim;
}
// Is layer l's MLP a mixture of experts (not one of first_dense_layers)?
inline bool moe_layer(const eng_model_shape& s, int32_t l) {
  return s.num_experts > 0 && l >= s.first_dense_layers;
}

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_PRESETS_H
