package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lockstep-ai/lockstep/fleet"
	"github.com/lockstep-ai/lockstep/scheduler"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/nccl"
	httpapi "github.com/lockstep-ai/lockstep/serve"
)

// apiServer is `worker serve`'s HTTP side (rank 0 only listens).
type apiServer struct {
	addr     string
	apiKey   string
	maxQueue int
	drain    time.Duration
	timeout  time.Duration // --request-timeout
	name     string
	limits   httpapi.HTTPOptions
	maxBody  int64
	// promptDetails: usage.prompt_tokens_details (vLLM's flag).
	promptDetails bool
	metricsCompat string // --metrics-compat: "" or "vllm"
	// autoTools and toolParser: --enable-auto-tool-choice, --tool-call-parser.
	autoTools  bool
	toolParser string
	// reasoning: --reasoning-parser.
	reasoning string
	// trustTemplate: --trust-request-chat-template.
	trustTemplate bool
	// tokensAsIDs: --return-tokens-as-token-ids.
	tokensAsIDs bool
	// policy: --scheduling-policy (vLLM's): fcfs or priority.
	policy string
	log    *zap.Logger // the server's request lines
	srv    *httpapi.Server
	http   *http.Server
	// exit ends the process on a second signal (os.Exit; tests replace it).
	exit func(code int)
}

// apiFlags registers serve's own flags.
func (api *apiServer) flags(fs *flag.FlagSet) {
	fs.StringVar(&api.addr, "http", api.addr, "address of the HTTP API (rank 0)")
	fs.StringVar(&api.apiKey, "api-key", os.Getenv("LOCKSTEP_API_KEY"), "require this Bearer token on every route but /health (default $LOCKSTEP_API_KEY)")
	fs.IntVar(&api.maxQueue, "max-queue", api.maxQueue, "requests in flight (accepted, unfinished) before new ones get 429")
	fs.DurationVar(&api.drain, "drain-timeout", api.drain, "on SIGTERM, how long accepted requests may still run before they are cancelled")
	fs.DurationVar(&api.timeout, "request-timeout", 0,
		"bound a completion request from its acceptance to its last token: past it the request is withdrawn on every rank and the client gets 504 (a stream an error event); 0: none")
	fs.StringVar(&api.name, "served-model-name", "", "the model's name in the API (default: the checkpoint's name, or the preset)")
	fs.IntVar(&api.limits.MaxConnections, "max-connections", 0,
		fmt.Sprintf("open client connections at once: at the bound the longest-idle keep-alive one is closed, else a new one gets 503 (0: %d, lowered to leave room under the descriptor limit)", httpapi.DefaultMaxConnections))
	fs.DurationVar(&api.limits.IdleTimeout, "idle-timeout", httpapi.DefaultIdleTimeout, "close keep-alive connections idle this long")
	fs.Int64Var(&api.maxBody, "max-body-bytes", httpapi.DefaultMaxBodyBytes, "largest request body (413 beyond)")
	fs.StringVar(&api.metricsCompat, "metrics-compat", "",
		"also expose another server's metric names on /metrics: vllm (vLLM's vllm:* families, labels model_name and engine = rank); default only lockstep_*")
	fs.BoolVar(&api.promptDetails, "enable-prompt-tokens-details", false,
		"add usage.prompt_tokens_details.cached_tokens (prompt tokens whose KV came from the prefix cache), as vLLM's flag")
	fs.BoolVar(&api.autoTools, "enable-auto-tool-choice", false,
		"let chat requests with tools use tool_choice \"auto\": the model's calls become the message's tool_calls (needs --tool-call-parser; docs/serving.md)")
	fs.StringVar(&api.policy, "scheduling-policy", "fcfs",
		"fcfs: requests in arrival order (a request's priority must be 0); priority: requests' priority field orders them, lower first, arrival order among equals (vLLM's flag; docs/serving.md)")
	fs.StringVar(&api.toolParser, "tool-call-parser", "",
		"how the model writes a tool call: "+strings.Join(httpapi.ToolCallParsers, ", ")+" (with --enable-auto-tool-choice)")
	fs.BoolVar(&api.trustTemplate, "trust-request-chat-template", false,
		"accept a request's own chat_template (chat and /tokenize; vLLM's flag): rendered in the same bounded sandbox as the model's")
	fs.BoolVar(&api.tokensAsIDs, "return-tokens-as-token-ids", false,
		"name the tokens of every answer's log-probabilities \"token_id:N\" (vLLM's flag; a request's return_tokens_as_token_ids asks it for itself)")
	fs.StringVar(&api.reasoning, "reasoning-parser", "",
		"how a reasoning model marks its thinking, which chat answers then give as reasoning_content: "+strings.Join(httpapi.ReasoningParsers, ", ")+" (vLLM's flag; docs/serving.md)")
}

// runAPIServe is `worker serve`: the fleet of `worker run` (same engine,
// rank, launcher and scheduler flags) behind an OpenAI-compatible API on
// rank 0. Requests enter the arrival collective; SIGTERM (or SIGINT) drains:
// no new request, the accepted ones finish within --drain-timeout, the rest
// are cancelled on every rank, and the process exits 0.
func runAPIServe(args []string, stdout, stderr io.Writer) error {
	o, api, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	if api.log, err = fleet.NewLogger(stderr, o.LogLevel); err != nil {
		return err
	}
	launch, err := api.build(o)
	if err != nil {
		return err
	}
	rank0 := !launch.MultiProcess() || launch.Rank == 0
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if rank0 {
		if err := api.listen(stderr, sigs); err != nil {
			return err
		}
	} else {
		// The other ranks follow rank 0's drain through the collectives.
		go func() {
			for range sigs {
			}
		}()
	}
	stop, err := startProfiles(o, launch, stderr)
	if err != nil {
		return err
	}
	_, runErr := fleet.Run(o, stderr, os.Getenv)
	if runErr != nil {
		api.srv.Fail(runErr)
	}
	if api.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		api.http.Shutdown(ctx) //nolint:errcheck
		cancel()
	}
	stop()
	if runErr == nil && rank0 {
		fmt.Fprintln(stderr, "worker serve: drained, exiting")
	}
	return runErr
}

// parseServe reads serve's flags (the fleet's and its own) and the config
// file, and refuses what a server cannot do.
func parseServe(args []string, stderr io.Writer) (*fleet.Options, *apiServer, error) {
	o := fleet.Defaults()
	o.Progress = "off"
	api := &apiServer{addr: "127.0.0.1:8000", maxQueue: 1024, drain: 30 * time.Second}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	api.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, usage.Wrap(err)
	}
	if fs.NArg() > 0 {
		return nil, nil, usage.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.Complete(fs); err != nil {
		return nil, nil, err
	}
	switch {
	case o.Engine == "twin":
		return nil, nil, usage.Errorf("serve needs a real engine (cpu, cuda or fake): the twin runs on a virtual clock, which HTTP clients do not share")
	case o.Trace != "" || o.Text.Active():
		return nil, nil, usage.Errorf("serve takes its requests over HTTP: --trace, --prompt and --prompts belong to `worker run`")
	case api.maxQueue < 1:
		return nil, nil, usage.Errorf("--max-queue must be at least 1, got %d", api.maxQueue)
	case api.timeout < 0:
		return nil, nil, usage.Errorf("--request-timeout must not be negative, got %v", api.timeout)
	case api.drain < 0:
		return nil, nil, usage.Errorf("--drain-timeout must not be negative, got %v", api.drain)
	case api.limits.MaxConnections < 0:
		return nil, nil, usage.Errorf("--max-connections must not be negative, got %d", api.limits.MaxConnections)
	case api.limits.IdleTimeout <= 0:
		return nil, nil, usage.Errorf("--idle-timeout must be positive, got %v", api.limits.IdleTimeout)
	case api.maxBody < 1:
		return nil, nil, usage.Errorf("--max-body-bytes must be at least 1, got %d", api.maxBody)
	case api.metricsCompat != "" && api.metricsCompat != "vllm":
		return nil, nil, usage.Errorf("--metrics-compat must be vllm (or empty for lockstep_* only), got %q", api.metricsCompat)
	case api.autoTools && api.toolParser == "":
		return nil, nil, usage.Errorf("--enable-auto-tool-choice needs --tool-call-parser (%s)", strings.Join(httpapi.ToolCallParsers, ", "))
	case api.toolParser != "" && !slices.Contains(httpapi.ToolCallParsers, api.toolParser):
		return nil, nil, usage.Errorf("--tool-call-parser must be one of %s, got %q", strings.Join(httpapi.ToolCallParsers, ", "), api.toolParser)
	case api.reasoning != "" && !slices.Contains(httpapi.ReasoningParsers, api.reasoning):
		return nil, nil, usage.Errorf("--reasoning-parser must be one of %s, got %q", strings.Join(httpapi.ReasoningParsers, ", "), api.reasoning)
	case api.policy != "fcfs" && api.policy != "priority":
		return nil, nil, usage.Errorf("--scheduling-policy must be fcfs or priority, got %q", api.policy)
	case api.toolParser != "" && !api.autoTools:
		return nil, nil, usage.Errorf("--tool-call-parser reads the calls of tool_choice \"auto\", which needs --enable-auto-tool-choice too")
	}
	return &o, api, nil
}

// build makes the HTTP server of o's fleet (its model, admission rules and
// metrics) and plugs it in as the fleet's request source.
func (api *apiServer) build(o *fleet.Options) (nccl.Launch, error) {
	sc, _, err := o.SchedulerConfig(os.Getenv)
	if err != nil {
		return nccl.Launch{}, usage.Wrap(err)
	}
	launch, err := nccl.DetectLaunch(os.Getenv)
	if err != nil {
		return launch, usage.Wrap(err)
	}
	shape, err := o.ModelShape()
	if err != nil {
		return launch, err
	}
	if api.name == "" {
		// The file's (or directory's) base name: what users type, without
		// spaces (a checkpoint's own general.name often has them).
		api.name = strings.TrimSuffix(filepath.Base(filepath.Clean(o.Model)), ".gguf")
	}
	cfg := httpapi.Config{ModelName: api.name, VocabSize: shape.VocabSize, MaxQueue: api.maxQueue, APIKey: api.apiKey,
		MaxModelLen: o.MaxModelLen(), MaxBodyBytes: api.maxBody, PromptTokensDetails: api.promptDetails, Log: api.log,
		RequestTimeout: api.timeout, ToolCallParser: api.toolParser, ReasoningParser: api.reasoning,
		TrustRequestChatTemplate: api.trustTemplate, TokensAsIDs: api.tokensAsIDs,
		// The CUDA backend does not score prompts (engine.h score_targets).
		NoPromptLogprobs: o.Engine == "cuda", PriorityScheduling: api.policy == "priority",
		// Half the watchdog's bound: /health says "stalled" before the
		// watchdog fails the fleet.
		StallAfter: o.CollectiveTimeout / 2}
	if m := o.Loaded(); m != nil {
		cfg.Tokenizer = m.Tokenizer
	}
	if cfg.Guides, err = o.Guides(); err != nil {
		return launch, err
	}
	if err := o.CheckChatTemplate(); err != nil {
		return launch, err
	}
	if adm, ok := o.Admission(sc); ok {
		cfg.Admission = adm.Verdict
	} else {
		cfg.Admission = func(int, int) scheduler.AdmissionVerdict { return scheduler.AdmissionVerdict{} }
	}
	cfg.AttentionDPRanks = o.AttentionDPRanks(launch)
	cfg.Metrics = httpapi.NewMetricsWith(api.name, o.AttentionDPRanks(launch),
		httpapi.MetricsOptions{VLLM: api.metricsCompat == "vllm", MaxModelLen: cfg.MaxModelLen})
	api.srv = httpapi.New(cfg)
	o.API = api.srv
	o.GPUFreeMemory = gpuFreeMemory
	return launch, nil
}

// listen puts the API on its address (rank 0) and drains on the first
// signal.
func (api *apiServer) listen(stderr io.Writer, sigs <-chan os.Signal) error {
	ln, err := net.Listen("tcp", api.addr)
	if err != nil {
		return usage.Errorf("--http %s: %v", api.addr, err)
	}
	hs, lim := api.srv.NewHTTPServer(ln, api.limits)
	api.http = hs
	go api.http.Serve(lim) //nolint:errcheck // ends with Shutdown
	fmt.Fprintf(stderr, "worker serve: listening on http://%s (model %q, at most %d connections); /health turns ready once every rank has initialised\n",
		ln.Addr(), api.name, httpapi.MaxConnections(lim))
	exit := api.exit
	if exit == nil {
		exit = os.Exit
	}
	go onSignals(sigs, stderr, api.drain, api.srv.Drain, exit)
	return nil
}

// onSignals drains on the first signal and exits at once (status 1) on
// the second, as uvicorn and vLLM do: an operator who signals twice wants
// the process gone, not a drain that may wait for --drain-timeout.
func onSignals(sigs <-chan os.Signal, stderr io.Writer, timeout time.Duration, drain func(context.Context), exit func(int)) {
	first := true
	for sig := range sigs {
		if !first {
			fmt.Fprintf(stderr, "worker serve: second signal (%v) during the drain: exiting now\n", sig)
			exit(1)
			return
		}
		first = false
		fmt.Fprintf(stderr, "worker serve: draining (at most %v; signal again to exit at once)\n", timeout)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			drain(ctx)
			cancel()
		}()
	}
}
