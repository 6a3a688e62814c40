package fleet

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/executor"

	"github.com/lockstep-ai/lockstep/workload/prompts"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/model"
	"github.com/lockstep-ai/lockstep/workload"
)

// PromptOptions are the text-input flags of `worker run` with a real model.
type PromptOptions struct {
	Prompt    string // --prompt
	File      string // --prompts
	Chat      bool   // --chat: Prompt is a user message rendered with the chat template
	System    string // --system: a system message for --chat
	MaxTokens int    // --max-tokens
	// Logprobs (--logprobs K): every completion token's log-probability and
	// the K most probable tokens' at its position (-1: none).
	Logprobs int
	// PromptLogprobs (--prompt-logprobs K): every prompt token's
	// log-probability but the first's, the K most probable tokens' at its
	// position, and the prompt's perplexity (-1: none).
	PromptLogprobs int
	inputs         []prompts.Input
}

func (p *PromptOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&p.Prompt, "prompt", p.Prompt, "with --model PATH: generate a continuation of this text (printed with the report)")
	fs.StringVar(&p.File, "prompts", p.File, "with --model PATH: JSON Lines of prompts, each {\"prompt\": TEXT} or {\"messages\": [{\"role\", \"content\"}...]}, optional \"max_tokens\"")
	fs.BoolVar(&p.Chat, "chat", p.Chat, "render --prompt as a user message with the model's chat template")
	fs.StringVar(&p.System, "system", p.System, "with --chat: a system message before the user's")
	fs.IntVar(&p.MaxTokens, "max-tokens", p.MaxTokens, "with --prompt or --prompts: most tokens to generate per prompt (a stop token of the model ends generation earlier)")
	fs.IntVar(&p.Logprobs, "logprobs", p.Logprobs, "with --prompt or --prompts: print each completion token's log-probability and the K most probable tokens' at its position, 0-20 (-1 = none)")
	fs.IntVar(&p.PromptLogprobs, "prompt-logprobs", p.PromptLogprobs, "with --prompt or --prompts: print each prompt token's log-probability (given the text before it), the K most probable tokens' at its position and the prompt's perplexity, 0-20 (-1 = none)")
}

// Active reports whether the run's workload is text prompts.
func (p *PromptOptions) Active() bool { return p.Prompt != "" || p.File != "" }

// validatePrompts checks the prompt flags against the rest of the options
// (after the model is open).
func (o *Options) validatePrompts() error {
	p := &o.Text
	if p.Logprobs < -1 || p.Logprobs > bridge.MaxLogprobs {
		return usage.Errorf("--logprobs must be in -1..%d (-1 = none), got %d", bridge.MaxLogprobs, p.Logprobs)
	}
	if p.PromptLogprobs < -1 || p.PromptLogprobs > bridge.MaxLogprobs {
		return usage.Errorf("--prompt-logprobs must be in -1..%d (-1 = none), got %d", bridge.MaxLogprobs, p.PromptLogprobs)
	}
	if p.PromptLogprobs >= 0 && o.Engine == "cuda" {
		return usage.Errorf("--prompt-logprobs needs an engine that scores prompts: the CUDA engine does not yet (use --engine cpu)")
	}
	if !p.Active() {
		if p.Chat || p.System != "" {
			return usage.Errorf("--chat and --system need --prompt")
		}
		if p.Logprobs >= 0 {
			return usage.Errorf("--logprobs needs --prompt or --prompts (a trace's tokens are synthetic)")
		}
		if p.PromptLogprobs >= 0 {
			return usage.Errorf("--prompt-logprobs needs --prompt or --prompts (a trace's tokens are synthetic)")
		}
		return nil
	}
	if o.loaded == nil {
		return usage.Errorf("--prompt and --prompts need a real model: --model PATH (a GGUF file or a Hugging Face directory); %s %q is a synthetic preset without a tokenizer", o.Src("model"), o.Model)
	}
	if p.Prompt != "" && p.File != "" {
		return usage.Errorf("--prompt and --prompts are mutually exclusive")
	}
	if o.Trace != "" {
		return usage.Errorf("--prompt/--prompts and %s are mutually exclusive (text prompts or a trace)", o.Src("trace"))
	}
	if p.MaxTokens < 1 {
		return usage.Errorf("--max-tokens must be at least 1, got %d", p.MaxTokens)
	}
	if p.System != "" && !p.Chat {
		return usage.Errorf("--system needs --chat")
	}
	if p.File != "" {
		if p.Chat {
			return usage.Errorf("--chat applies to --prompt; a prompts file gives chat prompts as \"messages\"")
		}
		var err error
		if p.inputs, err = prompts.ReadFile(p.File); err != nil {
			return err
		}
		return nil
	}
	in := prompts.Input{Text: p.Prompt, Place: "--prompt"}
	if p.Chat {
		if p.System != "" {
			in.Messages = append(in.Messages, model.ChatMessage{Role: "system", Content: p.System})
		}
		in.Messages = append(in.Messages, model.ChatMessage{Role: "user", Content: p.Prompt})
		in.Text = ""
	}
	p.inputs = []prompts.Input{in}
	return nil
}

// openModel loads --model when it names a checkpoint (validate).
func (o *Options) openModel() error {
	if !model.IsPath(o.Model) {
		if o.ChatTemplate != "" {
			return usage.Errorf("%s needs a checkpoint with a tokenizer; %s %s is a synthetic preset", o.Src("chat-template"), o.Src("model"), o.Model)
		}
		return nil
	}
	if o.Engine == "twin" {
		return usage.Errorf("%s %s: the twin models the presets of its cost profiles; a checkpoint needs --engine cpu, cuda or fake", o.Src("model"), o.Model)
	}
	m, err := model.Load(o.Model)
	if err != nil {
		return usage.Errorf("%s: %v", o.Src("model"), err)
	}
	if o.ChatTemplate != "" {
		src, err := readChatTemplate(o.ChatTemplate)
		if err != nil {
			return usage.Errorf("%s: %v", o.Src("chat-template"), err)
		}
		if m.Tokenizer == nil {
			return usage.Errorf("%s: %s has no tokenizer to render a chat with", o.Src("chat-template"), o.Model)
		}
		m.Tokenizer.SetChatTemplate(src)
	}
	o.loaded, o.guides = m, &guideState{}
	return nil
}

// readChatTemplate is --chat-template's template, read as vLLM reads the
// flag: a file when one is there, else the value itself when it looks like
// a template (it has a brace or a line break), else an error naming the
// missing file.
func readChatTemplate(v string) (string, error) {
	b, err := os.ReadFile(v)
	switch {
	case err == nil:
		if len(b) == 0 {
			return "", fmt.Errorf("%s is empty", v)
		}
		return string(b), nil
	case strings.ContainsAny(v, "{}\n"):
		return v, nil
	}
	return "", fmt.Errorf("no chat template file %s (%v)", v, err)
}

// CheckChatTemplate renders the loaded checkpoint's chat template once on
// a fixed conversation (model.CheckChatTemplate): a server refuses a broken
// template at startup instead of failing the first chat request. Nothing
// to check without a checkpoint or a template.
func (o *Options) CheckChatTemplate() error {
	if o.loaded == nil || o.loaded.Tokenizer == nil {
		return nil
	}
	tok := o.loaded.Tokenizer
	if err := model.CheckChatTemplate(tok.ChatTemplate(), tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS())); err != nil {
		if o.ChatTemplate != "" {
			return usage.Errorf("%s: %v", o.Src("chat-template"), err)
		}
		return usage.Errorf("%s %s: %v", o.Src("model"), o.Model, err)
	}
	return nil
}

// checkpointKVBudget (512 MiB) is the float32 KV memory per rank that sizes the CPU
// engine's pool for a checkpoint when --pages is not given: the preset
// default (4096 pages) would be gigabytes for a real model's layers.
const checkpointKVBudget = 512 << 20

// defaultCheckpointPages sizes --pages for a checkpoint on the CPU engine
// when it was not given: checkpointKVBudget of float32 pages, at most the
// preset default.
func (o *Options) defaultCheckpointPages() {
	if o.loaded == nil || o.Sources.PagesSet || o.Engine != "cpu" {
		return
	}
	page := o.TokensPerPage * o.loaded.Shape.KVBytesPerToken(4)
	if page > 0 {
		o.Pages = max(1, min(o.Pages, checkpointKVBudget/page))
	}
}

// renderedPrompt is a prompt as the engine sees it.
type renderedPrompt struct {
	input prompts.Input
	text  string // the text tokenised (chat: the rendered template)
	ids   []int32
}

// promptWorkload tokenises the prompts into requests that arrive at once and
// stop at the model's stop tokens.
func (o *Options) promptWorkload() ([]workload.Request, error) {
	tok := o.loaded.Tokenizer
	o.rendered = o.rendered[:0]
	reqs := make([]workload.Request, 0, len(o.Text.inputs))
	for i, in := range o.Text.inputs {
		r := renderedPrompt{input: in, text: in.Text}
		var ids []int32
		if in.Messages != nil {
			tmpl := tok.ChatTemplate()
			if tmpl == "" {
				return nil, usage.Errorf("%s: the model %s has no chat template", in.Place, o.loaded.Name)
			}
			text, err := model.RenderChat(tmpl, in.Messages, true, tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
			if err != nil {
				return nil, usage.Errorf("%s: %v", in.Place, err)
			}
			r.text = text
			// The template writes its own special tokens (BOS included).
			ids = tok.Encode(text, model.EncodeOptions{ParseSpecial: true})
		} else {
			ids = tok.Encode(in.Text, model.EncodeOptions{AddSpecial: true})
		}
		if len(ids) == 0 {
			return nil, usage.Errorf("%s: the prompt is empty (no tokens)", in.Place)
		}
		r.ids = ids
		maxTokens := o.Text.MaxTokens
		if in.MaxTokens > 0 {
			maxTokens = in.MaxTokens
		}
		reqs = append(reqs, workload.Request{Index: i, PromptLen: len(ids), MaxNewTokens: maxTokens, Prompt: ids, StopAtEOS: true,
			Logprobs: o.Text.Logprobs >= 0, TopLogprobs: o.topLogprobs(),
			PromptLogprobs: o.Text.PromptLogprobs >= 0, PromptTopLogprobs: max(o.Text.PromptLogprobs, 0)})
		o.rendered = append(o.rendered, r)
	}
	return reqs, nil
}

// topLogprobs is --logprobs as a top count (0 when off).
func (o *Options) topLogprobs() int { return max(o.Text.Logprobs, 0) }

// promptOutputs decodes the responses of a prompt run.
func (o *Options) promptOutputs(res *Result) []report.PromptOutput {
	tok := o.loaded.Tokenizer
	out := make([]report.PromptOutput, len(o.rendered))
	for i, r := range o.rendered {
		out[i] = report.PromptOutput{Index: i, Prompt: r.text, PromptTokens: len(r.ids), Error: "no response"}
	}
	for _, r := range res.Rank0.Responses {
		if int(r.ID) >= len(out) {
			continue
		}
		p := &out[r.ID]
		p.Error = r.Error
		ids := r.Output
		p.Tokens = len(ids)
		p.FinishReason = "length"
		if r.Stopped {
			p.FinishReason = "stop"
			ids = ids[:len(ids)-1] // the stop token is not text
		}
		p.Text = tok.Decode(ids)
		if o.Text.Logprobs >= 0 && len(r.Logprobs) == len(r.Output) {
			p.Logprobs = tokenLogprobs(tok, r.Output, r.Logprobs)
		}
		if prompt := o.rendered[r.ID].ids; o.Text.PromptLogprobs >= 0 && len(prompt) > 1 && len(r.PromptLogprobs) == len(prompt)-1 {
			p.PromptLogprobs = tokenLogprobs(tok, prompt[1:], r.PromptLogprobs)
			p.Perplexity = report.Perplexity(p.PromptLogprobs)
		}
	}
	return out
}

// tokenLogprobs names the tokens ids (one per entry of lps) and their top
// candidates for the report.
func tokenLogprobs(tok *model.Tokenizer, ids []int32, lps []executor.TokenLogprobs) []report.TokenLogprob {
	out := make([]report.TokenLogprob, len(ids))
	for k, lp := range lps {
		t := report.TokenLogprob{ID: ids[k], Token: tok.Decode(ids[k : k+1]), Logprob: lp.Logprob, Rank: lp.Rank}
		for j, id := range lp.TopIDs {
			t.Top = append(t.Top, report.TopLogprob{ID: id, Token: tok.Decode([]int32{id}), Logprob: lp.TopLogprobs[j]})
		}
		out[k] = t
	}
	return out
}
