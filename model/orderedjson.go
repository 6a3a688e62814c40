package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/lockstep-ai/lockstep/model/jinja"
)

// DecodeOrderedJSON decodes one JSON value for a chat template: objects
// become jinja.Ordered (their keys in the order written, as Python's
// json.loads keeps them, so that a template's tojson prints a tool's
// schema as the client wrote it), arrays []any, whole numbers int64,
// other numbers float64, null nil.
func DecodeOrderedJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeOrdered(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err == nil {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds the nesting DecodeOrderedJSON accepts (a schema
// nested deeper is not a tool's).
const maxJSONDepth = 64

func decodeOrdered(d *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxJSONDepth)
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '{':
			obj := jinja.Ordered{}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string) // object keys are strings
				v, err := decodeOrdered(d, depth+1)
				if err != nil {
					return nil, err
				}
				obj = append(obj, jinja.KV{Key: k, Value: v})
			}
			_, err := d.Token() // '}'
			return obj, err
		case '[':
			arr := []any{}
			for d.More() {
				v, err := decodeOrdered(d, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := d.Token() // ']'
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", x)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", x, err)
		}
		return f, nil
	default:
		return x, nil // string, bool, nil
	}
}
