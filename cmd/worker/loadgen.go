package main

// `worker loadgen`: the flags and printing of serve/loadgen's replay of a
// trace or prompts file against an OpenAI-compatible server (docs/loadgen.md).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/lockstep-ai/lockstep/internal/usage"
	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/serve/loadgen"
)

// loadgenFlags registers `worker loadgen`'s flags: the replay's options, and
// the command's own outputs (report, requestsOut).
func loadgenFlags(fs *flag.FlagSet, o *loadgen.Options, report, requestsOut *string) {
	fs.StringVar(&o.URL, "url", o.URL, "base URL of the OpenAI-compatible server (the /v1/... paths are appended)")
	fs.StringVar(&o.Model, "model", o.Model, "model name sent with each request (default: the first of GET /v1/models)")
	fs.StringVar(&o.APIKey, "api-key", o.APIKey, "Bearer token (default: $OPENAI_API_KEY)")
	fs.StringVar(&o.Trace, "trace", o.Trace, "Mooncake JSON Lines trace to replay (default: the built-in sample of 64 requests)")
	fs.StringVar(&o.PromptsFile, "prompts", o.PromptsFile, "JSON Lines of prompts, each {\"prompt\": TEXT} or {\"messages\": [...]}, optional \"max_tokens\"; sent at once")
	fs.IntVar(&o.Limit, "limit", o.Limit, "send at most N requests (0 = all)")
	fs.Float64Var(&o.LengthScale, "length-scale", o.LengthScale, "multiply a trace's input, output and block lengths by F")
	fs.Float64Var(&o.ArrivalScale, "arrival-scale", o.ArrivalScale, "multiply trace arrival times by F (0 = every request at once)")
	fs.StringVar(&o.Arrivals, "arrivals", o.Arrivals, "arrival process of a trace: trace (its own times, bursts included) or poisson (a Poisson process at its mean rate, seeded by --seed, same order)")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", o.MaxConcurrency, "most requests in flight (0 = unbounded); a request due while N are in flight waits")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "stop issuing requests after D (0 = no limit); requests in flight then get --grace to finish")
	fs.DurationVar(&o.Grace, "grace", o.Grace, "with --duration: how long requests in flight may run past it before they are cancelled")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "per-request limit, whole response included (0 = none)")
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "completions (/v1/completions) or chat (/v1/chat/completions; prompts with \"messages\" need it)")
	fs.StringVar(report, "report", *report, "report format: text or json")
	fs.StringVar(requestsOut, "requests-out", *requestsOut, "write one JSON line per request to this file")
	fs.StringVar(&o.Tokens, "tokens", o.Tokens, "how a trace's synthesised prompt is sent: ids (a token-id array; completions only) "+
		"or text (one common word per token, lengths approximate); default ids, text with --endpoint chat")
	fs.BoolVar(&o.InferConversations, "infer-conversations", o.InferConversations,
		"infer conversation ids of a Mooncake trace from its hash_ids prefix chains (as worker run) and send them as conversation_id (lockstep's server routes by them)")
	fs.BoolVar(&o.Stream, "stream", o.Stream, "stream responses (SSE); --stream=false measures E2E only")
	fs.BoolVar(&o.ReturnTokenIDs, "return-token-ids", o.ReturnTokenIDs, "ask for the output token ids (\"return_token_ids\": true: lockstep's server, recent vLLM) "+
		"to compute output_digest as worker run does")
	fs.BoolVar(&o.IgnoreEOS, "ignore-eos", o.IgnoreEOS, "trace requests: send \"ignore_eos\": true and \"min_tokens\" = max_tokens so that output lengths match the trace")
	fs.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "with --prompts: max_tokens of a prompt that does not give its own")
	fs.IntVar(&o.VocabSize, "vocab-size", o.VocabSize, fmt.Sprintf("trace prompt ids are in [0, N) (0: the preset's when --model names a lockstep preset, else %d)", loadgen.DefaultVocabSize))
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the synthesised prompt ids (as worker run --seed)")
}

// runLoadgen is `worker loadgen`.
func runLoadgen(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal stops the replay (the report covers what finished);
	// a second one kills the process as usual.
	go func() {
		<-ctx.Done()
		stop()
	}()
	return loadgenMain(ctx, args, stdout, stderr, os.Getenv)
}

// loadgenMain parses args, replays, and prints the report; ctx's
// cancellation (SIGINT) stops the replay, and the report covers what
// finished.
func loadgenMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	o := loadgen.Defaults()
	format, requestsOut := "text", ""
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	loadgenFlags(fs, &o, &format, &requestsOut)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.Validate(getenv); err != nil {
		return err
	}
	if err := usage.OneOf("--report", format, "text", "json"); err != nil {
		return err
	}
	if requestsOut != "" {
		for _, in := range []struct{ flag, path string }{{"--trace", o.Trace}, {"--prompts", o.PromptsFile}} {
			if in.path != "" && requestsOut != "-" && report.SameFile(requestsOut, in.path) {
				return usage.Errorf("--requests-out %q is the file %s reads: writing it would destroy it", requestsOut, in.flag)
			}
		}
	}
	// The workload and the server first: a replay refused for either
	// leaves an earlier --requests-out file as it was.
	g, err := loadgen.New(ctx, &o, stderr)
	if err != nil {
		return err
	}
	defer g.Close()
	var reqOut *report.OutputFile
	if requestsOut != "" {
		if reqOut, err = report.CreateOutput("--requests-out", requestsOut, false, nil); err != nil {
			return usage.Wrap(err)
		}
		defer reqOut.Close() //nolint:errcheck // closed again below, where its error is reported
	}
	results, wall := g.Replay(ctx)
	rep := g.Report(results, wall)
	if format == "json" {
		err = rep.WriteJSON(stdout)
	} else {
		err = g.WriteText(stdout, rep)
	}
	if reqOut != nil {
		err = errors.Join(err, g.WriteRequests(reqOut, results), reqOut.Close())
	}
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: the report covers the %d requests that completed", rep.Requests.Completed)
	}
	return rep.NothingServed()
}
