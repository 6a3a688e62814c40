package model

import (
	"encoding/json"
	"fmt"
)

// transformers 5 writes a config's RoPE as rope_parameters: {rope_type,
// rope_theta, and the scaling's own fields} in place of rope_theta and
// rope_scaling, or, for models whose layers differ (Gemma 3), one such
// object per layer type (full_attention, sliding_attention). A config
// re-saved by it has no top-level rope_theta: read as 10000, its RoPE would
// be silently wrong, so rope_parameters is read into the 4.x fields.

// hfRopeParameters moves c.RopeParameters into c.RopeTheta, c.RopeScaling
// and (the sliding layers' base) c.RopeLocalBaseFreq. Where both forms are
// given they must agree.
func hfRopeParameters(c *hfModelConfig) error {
	if len(c.RopeParameters) == 0 || string(c.RopeParameters) == "null" {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(c.RopeParameters, &top); err != nil {
		return fmt.Errorf("rope_parameters: %v", err)
	}
	full, sliding := c.RopeParameters, json.RawMessage(nil)
	if f, ok := top["full_attention"]; ok {
		full, sliding = f, top["sliding_attention"]
		for k := range top {
			if k != "full_attention" && k != "sliding_attention" {
				return fmt.Errorf("rope_parameters: layer type %q is not supported (full_attention, sliding_attention)", k)
			}
		}
	}
	theta, scaling, err := ropeParams("rope_parameters", full)
	if err != nil {
		return err
	}
	if c.RopeTheta != 0 && theta != 0 && c.RopeTheta != theta {
		return fmt.Errorf("rope_theta %v and rope_parameters' rope_theta %v differ", c.RopeTheta, theta)
	}
	if theta != 0 {
		c.RopeTheta = theta
	}
	if scaling != nil {
		if notNull(c.RopeScaling) {
			return fmt.Errorf("rope_scaling and a scaling in rope_parameters are both given; a config has one")
		}
		c.RopeScaling = scaling
	}
	if sliding != nil {
		st, ss, err := ropeParams("rope_parameters.sliding_attention", sliding)
		if err != nil {
			return err
		}
		if ss != nil {
			return fmt.Errorf("rope_parameters.sliding_attention: a scaling of the sliding layers is not supported")
		}
		if c.RopeLocalBaseFreq != 0 && st != 0 && c.RopeLocalBaseFreq != st {
			return fmt.Errorf("rope_local_base_freq %v and rope_parameters.sliding_attention's rope_theta %v differ", c.RopeLocalBaseFreq, st)
		}
		if st != 0 {
			c.RopeLocalBaseFreq = st
		}
	}
	return nil
}

// ropeParams reads one rope_parameters object: its rope_theta (0 when
// absent) and, unless its rope_type is default, the object itself as a
// rope_scaling.
func ropeParams(where string, raw json.RawMessage) (float64, json.RawMessage, error) {
	var p struct {
		RopeType string   `json:"rope_type"`
		Type     string   `json:"type"`
		Theta    *float64 `json:"rope_theta"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return 0, nil, fmt.Errorf("%s: %v", where, err)
	}
	theta := 0.0
	if p.Theta != nil {
		if !(*p.Theta > 0) {
			return 0, nil, fmt.Errorf("%s: rope_theta %v is not a positive number", where, *p.Theta)
		}
		theta = *p.Theta
	}
	t := p.RopeType
	if t == "" {
		t = p.Type
	}
	if t == "" || t == "default" {
		return theta, nil, nil
	}
	return theta, raw, nil
}

// notNull reports whether a raw JSON value is present and not null.
func notNull(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }
