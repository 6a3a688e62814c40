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

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_PRESETS_H
