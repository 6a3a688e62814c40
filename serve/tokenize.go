package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime/debug"

	"github.com/lockstep-ai/lockstep/model"
)

// tokenizeRequest is POST /tokenize in vLLM's two shapes: a completion
// prompt (prompt, add_special_tokens default true) or a chat conversation
// (messages, and tools, rendered with the model's template,
// add_generation_prompt default true, add_special_tokens default false),
// tokenised exactly as the matching endpoint tokenises its prompt.
type tokenizeRequest struct {
	Model              string           `json:"model"`
	Prompt             *string          `json:"prompt"`
	Messages           []chatMessageRaw `json:"messages"`
	Tools              json.RawMessage  `json:"tools"`
	ChatTemplateKwargs json.RawMessage  `json:"chat_template_kwargs"`
	// The chat request's rendering fields (vLLM's /tokenize has them too).
	ContinueFinalMessage bool    `json:"continue_final_message"`
	ChatTemplate         *string `json:"chat_template"`
	AddSpecialTokens     *bool   `json:"add_special_tokens"`
	AddGenerationPrompt  *bool   `json:"add_generation_prompt"`
	ReturnTokenStrs      bool    `json:"return_token_strs"`
}

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []int32   `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// detokenizeRequest and detokenizeResponse are vLLM's.
type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

type detokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// tokenize is POST /tokenize.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	release, e := s.decodeBody(w, r, &req)
	if e != nil {
		writeError(w, e)
		return
	}
	defer release()
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	tok := s.cfg.Tokenizer
	if tok == nil {
		writeError(w, badRequest("prompt", "this model has no tokenizer (a synthetic preset)"))
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("messages", "send either prompt or messages, not both"))
		return
	case req.Prompt != nil && notNull(req.Tools):
		writeError(w, badRequest("tools", "tools apply to messages only"))
		return
	case req.Prompt != nil:
		if req.AddGenerationPrompt != nil || req.ContinueFinalMessage || req.ChatTemplate != nil {
			writeError(w, badRequest("add_generation_prompt", "add_generation_prompt, continue_final_message and chat_template apply to messages only"))
			return
		}
		ids = tok.Encode(*req.Prompt, model.EncodeOptions{AddSpecial: req.AddSpecialTokens == nil || *req.AddSpecialTokens})
	case req.Messages != nil:
		cr := chatRequest{Messages: req.Messages, AddGenerationPrompt: req.AddGenerationPrompt,
			ContinueFinalMessage: req.ContinueFinalMessage, ChatTemplate: req.ChatTemplate}
		msgs, e := cr.messages()
		if e != nil {
			writeError(w, e)
			return
		}
		tmpl, e := s.chatTemplateOf(req.ChatTemplate)
		if e != nil {
			writeError(w, e)
			return
		}
		gen, e := cr.generationPrompt()
		if e != nil {
			writeError(w, e)
			return
		}
		// The tools render as a chat request's do (none: a plain conversation).
		var p genParams
		raw := rawParams{Tools: req.Tools, ToolChoice: json.RawMessage(`"none"`)}
		if e := raw.checkTools(&p, true); e != nil {
			writeError(w, e)
			return
		}
		if e := s.toolsFor(&p, tmpl); e != nil {
			writeError(w, e)
			return
		}
		kwargs, e := chatTemplateKwargs(req.ChatTemplateKwargs)
		if e != nil {
			writeError(w, e)
			return
		}
		text, err := model.RenderChatKwargs(tmpl, msgs, p.Tools, kwargs, gen, tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
		if err != nil {
			writeError(w, badRequest("messages", "the chat template failed on these messages: %v", err))
			return
		}
		if req.ContinueFinalMessage {
			if text, e = continueFinal(text, msgs[len(msgs)-1]); e != nil {
				writeError(w, e)
				return
			}
		}
		ids = tok.Encode(text, model.EncodeOptions{ParseSpecial: true, AddSpecial: req.AddSpecialTokens != nil && *req.AddSpecialTokens})
	default:
		writeError(w, badRequest("prompt", "prompt (or messages) is required"))
		return
	}
	out := tokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.MaxModelLen, Tokens: ids}
	if out.Tokens == nil {
		out.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i] = tok.TokenText(id)
		}
		out.TokenStrs = &strs
	}
	writeJSON(w, out)
}

// detokenize is POST /detokenize: the text of the ids, control tokens
// included (vLLM decodes with skip_special_tokens false here).
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	release, e := s.decodeBody(w, r, &req)
	if e != nil {
		writeError(w, e)
		return
	}
	defer release()
	if e := s.checkModel(req.Model); e != nil {
		writeError(w, e)
		return
	}
	if s.cfg.Tokenizer == nil {
		writeError(w, badRequest("tokens", "this model has no tokenizer (a synthetic preset)"))
		return
	}
	if req.Tokens == nil {
		writeError(w, badRequest("tokens", "tokens is required"))
		return
	}
	ids := make([]int32, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 || id >= int64(s.cfg.VocabSize) {
			writeError(w, badRequest("tokens", "token id %d at position %d is outside the vocabulary [0, %d)", id, i, s.cfg.VocabSize))
			return
		}
		ids[i] = int32(id)
	}
	writeJSON(w, detokenizeResponse{Prompt: s.cfg.Tokenizer.DecodeWith(ids, model.DecodeOptions{Special: true})})
}

// version is GET /version: {"version": ...}, as vLLM answers it.
func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, struct {
		Version string `json:"version"`
	}{s.cfg.Version})
}

// buildVersion is the binary's version: its module version, or the VCS
// revision of a development build.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" && len(st.Value) >= 12 {
				v += "+" + st.Value[:12]
			}
		}
	}
	return v
}

// checkModel is 404 for a model name other than the served one ("" is
// the served one).
func (s *Server) checkModel(name string) *apiError {
	if name != "" && name != s.cfg.ModelName {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server serves %q", name, s.cfg.ModelName)}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client may be gone
}
