//go:build native

package native

/*
#cgo CFLAGS: -I${SRCDIR}/../../native/include
#cgo LDFLAGS: -L${SRCDIR}/../../build/native -lengine -lstdc++ -lm
#include <stdlib.h>
#include "engine.h"
*/
import "C"

import (
	"fmt"
	"github.com/lockstep-ai/lockstep/internal/cputime"
	"math"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lockstep-ai/lockstep/bridge"
)

// engine is a native engine handle driven by its own locked goroutine.
type engine struct {
	// nativeCPU is the engine thread's CPU time inside the native step
	// calls (eng_engine_step, _submit, _wait): the engine's compute on the
	// CPU engine, whose compute runs on that thread. Engine goroutine only;
	// NativeCPU reads it through a request.
	nativeCPU time.Duration
	mu        sync.Mutex    // serialises requests; guards closed
	closed    bool          // after Close
	reqs      chan func()   // requests, run on the engine goroutine
	done      chan struct{} // one signal per finished request

	// tid is the engine thread's id, set by loop before its first request.
	// owned is true while RunOnEngineThread's function runs on that thread:
	// a call from that thread then runs inline (inline).
	tid   int
	owned atomic.Bool

	shape bridge.ModelShape // resolved at Open; immutable

	// Owned by the engine goroutine.
	h     C.eng_engine_t
	bufs  stepBuffers
	cdesc *C.eng_step_desc   // C memory: a Go local passed to C would escape
	cres  *C.eng_step_result // to the heap, one allocation per step each

	// Arguments and result of the Step request, passed through fields so that
	// a step allocates no closure (stepFn is bound once at Open).
	stepFn   func()
	stepDesc *bridge.StepDesc
	stepRes  *bridge.StepResult
	stepErr  error

	// Submitted steps not yet waited for, oldest first (engine goroutine).
	pending []pendingStep
}

// pendingStep is what Wait needs to know of a submitted step.
type pendingStep struct {
	seqs, sampled int
	logits        bool
	logprobs      bool // some sampled sequence asks for log-probabilities
	scores        int  // rows of a step that scores some (0: none scored)
}

// Open starts a native engine of cfg's backend ("cpu" when cfg.Backend is
// ""). The engine must be closed with Close, which frees its native memory.
func Open(cfg bridge.Config) (bridge.Engine, error) {
	backend, err := backendOf(cfg.Backend)
	if err != nil {
		return nil, err
	}
	e := &engine{reqs: make(chan func()), done: make(chan struct{})}
	e.stepFn = e.doStep
	go e.loop()
	var initErr error
	e.run(func() { initErr = e.init(cfg, backend) })
	if initErr != nil {
		close(e.reqs)
		e.closed = true
		return nil, initErr
	}
	return e, nil
}

// SupportedBackends lists the backends the linked native library was built
// with ("cpu" always, "cuda" with ENGINE_CUDA).
func SupportedBackends() []string {
	bits := uint32(C.eng_supported_backends())
	var names []string
	if bits&(1<<C.ENG_BACKEND_CPU) != 0 {
		names = append(names, "cpu")
	}
	if bits&(1<<C.ENG_BACKEND_CUDA) != 0 {
		names = append(names, "cuda")
	}
	return names
}

// PresetShape returns the native library's shape of a named preset. It must
// equal bridge.Presets[name]; tests check that it does.
func PresetShape(name string) (bridge.ModelShape, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var s C.eng_model_shape
	// eng_last_error is thread-local: read it on the thread that failed.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := C.eng_preset_shape(cname, &s); st != C.ENG_OK {
		return bridge.ModelShape{}, bridge.StatusError("preset", bridge.Status(st), C.GoString(C.eng_last_error()))
	}
	return shapeFromC(&s), nil
}

func backendOf(name string) (C.eng_backend, error) {
	switch name {
	case "", "cpu":
		return C.ENG_BACKEND_CPU, nil
	case "cuda":
		return C.ENG_BACKEND_CUDA, nil
	}
	return 0, bridge.StatusError("init", bridge.StatusInvalidArgument,
		fmt.Sprintf("unknown backend %q (allowed: cpu, cuda)", name))
}

// status converts a native status of a call on the handle into an error.
// Runs on the engine goroutine.
func (e *engine) status(op string, st C.eng_status) error {
	if st == C.ENG_OK {
		return nil
	}
	return bridge.StatusError(op, bridge.Status(st), C.GoString(C.eng_engine_last_error(e.h)))
}

// init creates the handle. Runs on the engine goroutine.
func (e *engine) init(cfg bridge.Config, backend C.eng_backend) error {
	var c C.eng_engine_config
	c.abi_version = C.ENG_ABI_VERSION
	c.backend = backend
	c.seed = C.uint64_t(cfg.Seed)
	c.validate_only = 0
	if cfg.ValidateOnly {
		c.validate_only = 1
	}
	ints := []struct {
		field string
		v     int
		dst   *C.int32_t
	}{
		{"NumPages", cfg.NumPages, &c.num_pages},
		{"TokensPerPage", cfg.TokensPerPage, &c.tokens_per_page},
		{"NumHostPages", cfg.NumHostPages, &c.num_host_pages},
		{"DeviceID", cfg.DeviceID, &c.device_id},
		{"CPUThreads", cfg.CPUThreads, &c.num_threads},
	}
	switch cfg.CPUKernels {
	case "", "exact":
		c.cpu_kernels = C.ENG_CPU_KERNELS_EXACT
	case "quant":
		c.cpu_kernels = C.ENG_CPU_KERNELS_QUANT
	default:
		return bridge.StatusError("init", bridge.StatusInvalidArgument,
			fmt.Sprintf("Config.CPUKernels %q is not a CPU kernel set (allowed: exact, quant)", cfg.CPUKernels))
	}
	for _, f := range ints {
		if err := setInt32(f.dst, "init", "Config."+f.field, f.v); err != nil {
			return err
		}
	}
	if cfg.Preset == "" {
		if err := shapeToC(&cfg.Shape, &c.shape); err != nil {
			return err
		}
	} else {
		c.preset = C.CString(cfg.Preset)
		defer C.free(unsafe.Pointer(c.preset))
	}
	if len(cfg.Tensors) > 0 {
		if cfg.Preset != "" {
			return bridge.StatusError("init", bridge.StatusInvalidArgument, "Config.Tensors need Preset \"\" and the checkpoint's Shape")
		}
		// The descriptors live in C memory; the tensors' data (a mapped
		// file, or pinned Go memory) is read during eng_engine_init only.
		n := len(cfg.Tensors)
		ts := (*[1 << 28]C.eng_tensor)(C.calloc(C.size_t(n), C.sizeof_eng_tensor))[:n:n]
		defer C.free(unsafe.Pointer(&ts[0]))
		var pin runtime.Pinner
		defer pin.Unpin()
		for i, t := range cfg.Tensors {
			if err := setInt32(&ts[i].layer, "init", fmt.Sprintf("Tensors[%d] (%s).Layer", i, t.Name), t.Layer); err != nil {
				return err
			}
			if err := setInt32(&ts[i].interleaved_rope_heads, "init", fmt.Sprintf("Tensors[%d] (%s).InterleavedRopeHeads", i, t.Name), t.InterleavedRopeHeads); err != nil {
				return err
			}
			if err := setInt32(&ts[i].expert, "init", fmt.Sprintf("Tensors[%d] (%s).Expert", i, t.Name), t.Expert); err != nil {
				return err
			}
			ts[i].kind = C.int32_t(t.Kind)
			ts[i].dtype = C.int32_t(t.DType)
			ts[i].rows = C.int64_t(t.Rows)
			ts[i].cols = C.int64_t(t.Cols)
			ts[i].nbytes = C.int64_t(len(t.Data))
			if len(t.Data) > 0 {
				pin.Pin(&t.Data[0])
				ts[i].data = unsafe.Pointer(&t.Data[0])
			}
		}
		c.tensors = &ts[0]
		c.num_tensors = C.int32_t(n)
	}
	if st := C.eng_engine_init(&c, &e.h); st != C.ENG_OK {
		return bridge.StatusError("init", bridge.Status(st), nameTensors(C.GoString(C.eng_last_error()), cfg.Tensors))
	}
	var s C.eng_model_shape
	if err := e.status("shape", C.eng_engine_shape(e.h, &s)); err != nil {
		C.eng_engine_free(e.h)
		e.h = nil
		return err
	}
	e.shape = shapeFromC(&s)
	if h := cfg.Helix; h != nil {
		g, ok := h.Group.(*CPGroup)
		if !ok || g == nil {
			C.eng_engine_free(e.h)
			e.h = nil
			return bridge.StatusError("init", bridge.StatusInvalidArgument,
				fmt.Sprintf("Config.Helix.Group must be a *native.CPGroup, got %T", h.Group))
		}
		if g.Size() != h.Size {
			C.eng_engine_free(e.h)
			e.h = nil
			return bridge.StatusError("init", bridge.StatusInvalidArgument,
				fmt.Sprintf("Config.Helix.Size %d does not match the group's size %d", h.Size, g.Size()))
		}
		if err := g.join(e, h.Rank); err != nil {
			C.eng_engine_free(e.h)
			e.h = nil
			return err
		}
	}
	if x := cfg.Expert; x != nil {
		g, ok := x.Group.(*CPGroup)
		var err error
		switch {
		case !ok || g == nil:
			err = bridge.StatusError("init", bridge.StatusInvalidArgument,
				fmt.Sprintf("Config.Expert.Group must be a *native.CPGroup, got %T", x.Group))
		case g.Size() != x.Size:
			err = bridge.StatusError("init", bridge.StatusInvalidArgument,
				fmt.Sprintf("Config.Expert.Size %d does not match the group's size %d", x.Size, g.Size()))
		default:
			err = g.joinEP(e, x.Rank)
		}
		if err != nil {
			C.eng_engine_free(e.h)
			e.h = nil
			return err
		}
	}
	e.cdesc = (*C.eng_step_desc)(C.calloc(1, C.sizeof_eng_step_desc))
	e.cres = (*C.eng_step_result)(C.calloc(1, C.sizeof_eng_step_result))
	return nil
}

// Shape is the resolved model shape.
func (e *engine) Shape() bridge.ModelShape { return e.shape }

// Step runs one forward step with exactly one cgo call.
func (e *engine) Step(desc *bridge.StepDesc, res *bridge.StepResult) error {
	if e.inline() {
		return e.flattenAndStep(desc, res)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("engine step: %w", bridge.ErrClosed)
	}
	e.stepDesc, e.stepRes = desc, res
	e.reqs <- e.stepFn
	<-e.done
	err := e.stepErr
	e.stepDesc, e.stepRes, e.stepErr = nil, nil, nil
	return err
}

// doStep flattens the descriptor into the C buffers, calls eng_engine_step
// and copies the results out. Runs on the engine goroutine.
func (e *engine) doStep() {
	e.stepErr = e.flattenAndStep(e.stepDesc, e.stepRes)
}

func (e *engine) flattenAndStep(desc *bridge.StepDesc, res *bridge.StepResult) error {
	if res == nil {
		return bridge.StatusError("step", bridge.StatusInvalidArgument, "desc and res must not be nil")
	}
	n, sampled, err := e.flatten("step", desc)
	if err != nil {
		return err
	}
	b := &e.bufs
	out := b.sampled.slice(n)
	var logits []float32
	cres := e.cres
	*cres = C.eng_step_result{sampled: (*C.int32_t)(b.sampled.p)}
	if desc.WantLogits {
		logits = b.logits.slice(sampled * e.shape.VocabSize)
		cres.logits = (*C.float)(b.logits.p)
	}
	lp := desc.WantsLogprobs()
	e.logprobResults(cres, n, lp)
	scores := e.scoreRows(desc)
	e.scoreResults(cres, scores)
	c0, _ := cputime.Thread() // the engine goroutine is locked to its thread
	st := C.eng_engine_step(e.h, e.cdesc, cres)
	c1, _ := cputime.Thread()
	e.nativeCPU += c1 - c0
	if err := e.status("step", st); err != nil {
		return err
	}
	res.Sampled = append(res.Sampled[:0], out...)
	res.Logits = append(res.Logits[:0], logits...)
	e.copyLogprobs(res, n, lp)
	e.copyScores(res, scores)
	res.DeviceMS = float64(cres.device_ms)
	res.MoEWaitMS = float64(cres.moe_wait_ms)
	return nil
}

// scoreRows is the number of rows of desc when it scores some, else 0.
func (e *engine) scoreRows(desc *bridge.StepDesc) int {
	if want, rows := desc.WantsScores(); want {
		return rows
	}
	return 0
}

// scoreResults points cres's scoring arrays at the reusable C buffers for
// rows rows (rows > 0) or leaves them NULL.
func (e *engine) scoreResults(cres *C.eng_step_result, rows int) {
	if rows == 0 {
		return
	}
	b := &e.bufs
	b.scoreLogprobs.slice(rows)
	b.scoreTopIDs.slice(rows * bridge.MaxLogprobs)
	b.scoreTopLogprobs.slice(rows * bridge.MaxLogprobs)
	cres.score_logprobs = (*C.float)(b.scoreLogprobs.p)
	cres.score_top_ids = b.scoreTopIDs.ptr()
	cres.score_top_logprobs = (*C.float)(b.scoreTopLogprobs.p)
	b.scoreRanks.slice(rows)
	cres.score_ranks = b.scoreRanks.ptr()
}

// copyScores copies the scores of rows rows out of the C buffers into res
// (rows > 0), or empties res's.
func (e *engine) copyScores(res *bridge.StepResult, rows int) {
	bridge.ResizeScores(res, rows, rows > 0)
	if rows == 0 {
		return
	}
	b := &e.bufs
	copy(res.ScoreLogprobs, b.scoreLogprobs.slice(rows))
	copy(res.ScoreTopIDs, b.scoreTopIDs.slice(rows*bridge.MaxLogprobs))
	copy(res.ScoreTopLogprobs, b.scoreTopLogprobs.slice(rows*bridge.MaxLogprobs))
	copy(res.ScoreRanks, b.scoreRanks.slice(rows))
}

// logprobResults points cres's log-probability arrays at the reusable C
// buffers for n sequences (want) or leaves them NULL.
func (e *engine) logprobResults(cres *C.eng_step_result, n int, want bool) {
	if !want {
		return
	}
	b := &e.bufs
	b.logprobs.slice(n)
	b.topIDs.slice(n * bridge.MaxLogprobs)
	b.topLogprobs.slice(n * bridge.MaxLogprobs)
	cres.logprobs = (*C.float)(b.logprobs.p)
	cres.top_logprob_ids = b.topIDs.ptr()
	cres.top_logprobs = (*C.float)(b.topLogprobs.p)
}

// copyLogprobs copies the log-probabilities of n sequences out of the C
// buffers into res (want), or empties res's.
func (e *engine) copyLogprobs(res *bridge.StepResult, n int, want bool) {
	bridge.ResizeLogprobs(res, n, want)
	if !want {
		return
	}
	b := &e.bufs
	copy(res.Logprobs, b.logprobs.slice(n))
	copy(res.TopLogprobIDs, b.topIDs.slice(n*bridge.MaxLogprobs))
	copy(res.TopLogprobs, b.topLogprobs.slice(n*bridge.MaxLogprobs))
}

// flatten copies desc into the reusable C buffers and fills e.cdesc. It
// returns the number of sequences and of sampled sequences.
func (e *engine) flatten(op string, desc *bridge.StepDesc) (n, sampled int, err error) {
	if desc == nil {
		return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument, "desc and res must not be nil")
	}
	n = len(desc.Seqs)
	var totalTok, totalBlk int
	for i := range desc.Seqs {
		s := &desc.Seqs[i]
		if s.StartPos < math.MinInt32 || s.StartPos > math.MaxInt32 {
			return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument,
				fmt.Sprintf("Seqs[%d].StartPos = %d is out of the int32 range", i, s.StartPos))
		}
		totalTok += len(s.Tokens)
		totalBlk += len(s.BlockTable)
		if s.Sample {
			sampled++
		}
	}
	if n > math.MaxInt32 || totalTok > math.MaxInt32 || totalBlk > math.MaxInt32 {
		return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument,
			fmt.Sprintf("step too large: %d sequences, %d tokens, %d blocks (each must fit in int32)", n, totalTok, totalBlk))
	}
	b := &e.bufs
	numTokens := b.numTokens.slice(n)
	startPos := b.startPos.slice(n)
	numBlocks := b.numBlocks.slice(n)
	sample := b.sample.slice(n)
	tokens := b.tokens.slice(totalTok)
	blocks := b.blocks.slice(totalBlk)
	// The sampling array is passed only when some sequence samples
	// stochastically or with logits processors; NULL = every sequence greedy.
	var csampling *C.eng_sampling
	nids, nbias, nmasks := 0, 0, 0
	words := bridge.AllowedWords(e.shape.VocabSize)
	for i := range desc.Seqs {
		s := &desc.Seqs[i]
		if err := s.Sampling.Validate(); err != nil {
			return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf("Seqs[%d]: %v", i, err))
		}
		if err := s.ValidateLogprobs(); err != nil {
			return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf("Seqs[%d]: %v", i, err))
		}
		if err := bridge.ValidateAllowed(s.Allowed, e.shape.VocabSize); err != nil {
			return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf("Seqs[%d]: %v", i, err))
		}
		if err := s.ValidateScore(e.shape.VocabSize); err != nil {
			return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument, fmt.Sprintf("Seqs[%d]: %v", i, err))
		}
		if s.Sample && s.Logprobs {
			csampling = b.sampling.slice(n)
		}
		if s.Sample && (!s.Sampling.IsGreedy() || s.HasProcessors()) {
			csampling = b.sampling.slice(n)
			nbias += len(s.LogitBias)
			nids += len(s.LogitBias)
			if s.Sampling.HasPenalties() {
				nids += len(s.PromptTokens) + len(s.OutputTokens)
			}
			if s.Allowed != nil {
				nmasks++
			}
		}
	}
	if nids > math.MaxInt32 {
		return 0, 0, bridge.StatusError(op, bridge.StatusInvalidArgument,
			fmt.Sprintf("step too large: %d sampling token ids (must fit in int32)", nids))
	}
	if csampling != nil {
		cs := unsafe.Slice(csampling, n)
		ids := b.samplingIDs.slice(nids)
		vals := b.biasValues.slice(nbias)
		masks := b.allowed.slice(nmasks * words)
		at, bat, mat := 0, 0, 0
		for i := range desc.Seqs {
			s := &desc.Seqs[i]
			p := &s.Sampling
			cs[i] = C.eng_sampling{temperature: C.float(p.Temperature), top_k: C.int32_t(p.TopK),
				top_p: C.float(p.NativeTopP()), seed: C.uint64_t(p.Seed), min_p: C.float(p.MinP),
				presence_penalty: C.float(p.PresencePenalty), frequency_penalty: C.float(p.FrequencyPenalty),
				repetition_penalty: C.float(p.RepetitionPenalty)}
			if s.Sample && s.Logprobs {
				cs[i].logprobs, cs[i].top_logprobs = 1, C.int32_t(s.TopLogprobs)
			}
			if !s.Sample || (p.IsGreedy() && !s.HasProcessors()) {
				continue
			}
			base := unsafe.Pointer(b.samplingIDs.p)
			ptr := func(k int) *C.int32_t { return (*C.int32_t)(unsafe.Add(base, 4*k)) }
			cs[i].num_bias = C.int32_t(len(s.LogitBias))
			cs[i].bias_ids = ptr(at)
			cs[i].bias_values = (*C.float)(unsafe.Add(b.biasValues.p, 4*bat))
			for _, tb := range s.LogitBias {
				ids[at], vals[bat] = tb.ID, tb.Bias
				at, bat = at+1, bat+1
			}
			if p.HasPenalties() {
				cs[i].num_prompt, cs[i].prompt_tokens = C.int32_t(len(s.PromptTokens)), ptr(at)
				at += copy(ids[at:], s.PromptTokens)
				cs[i].num_output, cs[i].output_tokens = C.int32_t(len(s.OutputTokens)), ptr(at)
				at += copy(ids[at:], s.OutputTokens)
			}
			if s.Allowed != nil {
				cs[i].allowed = (*C.uint32_t)(unsafe.Add(b.allowed.p, 4*mat))
				mat += copy(masks[mat:], s.Allowed)
			}
		}
	}
	tok, blk := 0, 0
	for i := range desc.Seqs {
		s := &desc.Seqs[i]
		numTokens[i] = int32(len(s.Tokens))
		startPos[i] = int32(s.StartPos)
		numBlocks[i] = int32(len(s.BlockTable))
		sample[i] = 0
		if s.Sample {
			sample[i] = 1
		}
		tok += copy(tokens[tok:], s.Tokens)
		blk += copy(blocks[blk:], s.BlockTable)
	}
	*e.cdesc = C.eng_step_desc{
		num_seqs:    C.int32_t(n),
		num_tokens:  b.numTokens.ptr(),
		start_pos:   b.startPos.ptr(),
		tokens:      b.tokens.ptr(),
		num_blocks:  b.numBlocks.ptr(),
		block_table: b.blocks.ptr(),
		sample:      (*C.uint8_t)(b.sample.p),
		sampling:    csampling,
	}
	if want, _ := desc.WantsScores(); want {
		// Prompt scoring: every row's target (−1 where not scored).
		targets, top := b.scoreTargets.slice(totalTok), b.scoreTop.slice(n)
		at := 0
		for i := range desc.Seqs {
			s := &desc.Seqs[i]
			top[i] = int32(s.ScoreTop)
			if s.ScoreTargets != nil {
				at += copy(targets[at:], s.ScoreTargets)
				continue
			}
			for range s.Tokens {
				targets[at] = -1
				at++
			}
		}
		e.cdesc.score_targets, e.cdesc.score_top = b.scoreTargets.ptr(), b.scoreTop.ptr()
	}
	return n, sampled, nil
}

// Submit queues a step on the engine's stream and returns without waiting
// for it (one cgo call; the engine copies the descriptor).
func (e *engine) Submit(desc *bridge.StepDesc) error {
	if e.inline() {
		return e.doSubmit(desc)
	}
	var err error
	if cerr := e.call("submit", func() { err = e.doSubmit(desc) }); cerr != nil {
		return cerr
	}
	return err
}

// doSubmit flattens desc and queues it on the engine's stream. Runs on the
// engine goroutine.
func (e *engine) doSubmit(desc *bridge.StepDesc) error {
	n, sampled, err := e.flatten("submit", desc)
	if err != nil {
		return err
	}
	want := C.int32_t(0)
	if desc.WantLogits {
		want = 1
	}
	c0, _ := cputime.Thread()
	st := C.eng_engine_submit(e.h, e.cdesc, want)
	c1, _ := cputime.Thread()
	e.nativeCPU += c1 - c0
	if err := e.status("submit", st); err != nil {
		return err
	}
	e.pending = append(e.pending, pendingStep{seqs: n, sampled: sampled, logits: desc.WantLogits,
		logprobs: desc.WantsLogprobs(), scores: e.scoreRows(desc)})
	return nil
}

// Wait blocks until the oldest submitted step finished and writes its result.
func (e *engine) Wait(res *bridge.StepResult) error {
	if res == nil {
		return bridge.StatusError("wait", bridge.StatusInvalidArgument, "res must not be nil")
	}
	if e.inline() {
		return e.doWait(res)
	}
	var err error
	if cerr := e.call("wait", func() { err = e.doWait(res) }); cerr != nil {
		return cerr
	}
	return err
}

// doWait waits for the oldest submitted step and copies its results into
// res. Runs on the engine goroutine.
func (e *engine) doWait(res *bridge.StepResult) error {
	if len(e.pending) == 0 {
		return bridge.StatusError("wait", bridge.StatusInvalidArgument, "no submitted step to wait for")
	}
	p := e.pending[0]
	// Shift in place (at most MaxInflight entries), so that the slice
	// never creeps along its array and reallocates.
	e.pending = e.pending[:copy(e.pending, e.pending[1:])]
	b := &e.bufs
	out := b.sampled.slice(p.seqs)
	cres := e.cres
	*cres = C.eng_step_result{sampled: (*C.int32_t)(b.sampled.p)}
	var logits []float32
	if p.logits {
		logits = b.logits.slice(p.sampled * e.shape.VocabSize)
		cres.logits = (*C.float)(b.logits.p)
	}
	e.logprobResults(cres, p.seqs, p.logprobs)
	e.scoreResults(cres, p.scores)
	c0, _ := cputime.Thread()
	st := C.eng_engine_wait(e.h, cres)
	c1, _ := cputime.Thread()
	e.nativeCPU += c1 - c0
	if err := e.status("wait", st); err != nil {
		return err
	}
	res.Sampled = append(res.Sampled[:0], out...)
	res.Logits = append(res.Logits[:0], logits...)
	e.copyLogprobs(res, p.seqs, p.logprobs)
	e.copyScores(res, p.scores)
	res.DeviceMS = float64(cres.device_ms)
	res.MoEWaitMS = float64(cres.moe_wait_ms)
	return nil
}

// CopyPages copies page src[k] of srcTier to page dst[k] of dstTier.
func (e *engine) CopyPages(srcTier bridge.Tier, src []int32, dstTier bridge.Tier, dst []int32) error {
	if len(src) != len(dst) {
		return bridge.StatusError("copy_pages", bridge.StatusInvalidArgument,
			fmt.Sprintf("src has %d pages but dst has %d", len(src), len(dst)))
	}
	if len(src) > math.MaxInt32 {
		return bridge.StatusError("copy_pages", bridge.StatusInvalidArgument,
			fmt.Sprintf("%d pages do not fit in int32", len(src)))
	}
	var err error
	if cerr := e.call("copy_pages", func() {
		b := &e.bufs
		copy(b.copySrc.slice(len(src)), src)
		copy(b.copyDst.slice(len(dst)), dst)
		st := C.eng_engine_copy_pages(e.h, C.eng_tier(srcTier), b.copySrc.ptr(), C.eng_tier(dstTier),
			b.copyDst.ptr(), C.int32_t(len(src)))
		err = e.status("copy_pages", st)
	}); cerr != nil {
		return cerr
	}
	return err
}

// Close frees the native engine and stops its goroutine. Further calls,
// Close included, fail with bridge.ErrClosed.
func (e *engine) Close() error {
	if e.inline() {
		return bridge.StatusError("close", bridge.StatusInvalidArgument,
			"the engine cannot be closed from inside RunOnEngineThread")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("engine close: %w", bridge.ErrClosed)
	}
	var err error
	e.reqs <- func() {
		err = e.status("close", C.eng_engine_free(e.h))
		e.h = nil
		e.bufs.free()
		C.free(unsafe.Pointer(e.cdesc))
		C.free(unsafe.Pointer(e.cres))
		e.cdesc, e.cres = nil, nil
	}
	<-e.done
	close(e.reqs)
	e.closed = true
	return err
}

var tensorIndex = regexp.MustCompile(`tensors\[(\d+)\]`)

// nameTensors adds the checkpoint's name to a native message that names a
// tensor by its index.
func nameTensors(msg string, ts []bridge.WeightTensor) string {
	return tensorIndex.ReplaceAllStringFunc(msg, func(m string) string {
		i, err := strconv.Atoi(tensorIndex.FindStringSubmatch(m)[1])
		if err != nil || i >= len(ts) || ts[i].Name == "" {
			return m
		}
		return fmt.Sprintf("%s %q", m, ts[i].Name)
	})
}

// MoEStats are an engine's cumulative MoE exchange counters (eng_moe_stats).
type MoEStats struct {
	Exchanges     uint64  // dispatches + combines
	BytesSent     uint64  // to other EP members
	BytesReceived uint64  // from other EP members
	TokensRouted  uint64  // (token, expert) pairs this engine dispatched
	WaitMS        float64 // time inside exchanges
}

// EngineMoEStats returns a native engine's MoE counters (after its
// submitted steps finished); an error for an engine that is not native.
func EngineMoEStats(eng bridge.Engine) (MoEStats, error) {
	e, ok := eng.(*engine)
	if !ok {
		return MoEStats{}, fmt.Errorf("MoE statistics need a native engine, got %T", eng)
	}
	var out MoEStats
	var err error
	if cerr := e.call("moe_stats", func() {
		var st C.eng_moe_stats
		if err = e.status("moe_stats", C.eng_engine_moe_stats(e.h, &st)); err == nil {
			out = MoEStats{Exchanges: uint64(st.exchanges), BytesSent: uint64(st.bytes_sent),
				BytesReceived: uint64(st.bytes_received), TokensRouted: uint64(st.tokens_routed), WaitMS: float64(st.wait_ms)}
		}
	}); cerr != nil {
		return MoEStats{}, cerr
	}
	return out, err
}

// StallNextExchange implements bridge.ExchangeStaller (fault injection for
// tests): the engine's next in-step exchange of kind (-1 any) at layer (-1
// any) first sleeps for d, as a member that stopped inside it would.
func (e *engine) StallNextExchange(kind bridge.ExchangeKind, layer int, d time.Duration) error {
	ms := d.Milliseconds()
	if ms < 1 || ms > 1<<31-1 {
		return bridge.StatusError("test_stall", bridge.StatusInvalidArgument, fmt.Sprintf("duration %v out of range [1ms, 2^31 ms)", d))
	}
	var err error
	if cerr := e.call("test_stall", func() {
		err = e.status("test_stall", C.eng_engine_test_stall(e.h, C.int32_t(kind), C.int32_t(layer), C.int32_t(ms)))
	}); cerr != nil {
		return cerr
	}
	return err
}

// MoELayerStats are one MoE layer's exchange counters of an engine: steps
// that ran it, bytes sent to other EP members by its dispatch and combine,
// and the time inside each.
type MoELayerStats struct {
	Calls                       uint64
	DispatchBytes, CombineBytes uint64
	DispatchMS, CombineMS       float64
}

// EngineMoELayerStats returns layer's MoE counters of a native engine.
func EngineMoELayerStats(eng bridge.Engine, layer int) (MoELayerStats, error) {
	e, ok := eng.(*engine)
	if !ok {
		return MoELayerStats{}, fmt.Errorf("MoE statistics need a native engine, got %T", eng)
	}
	if layer < 0 || layer > math.MaxInt32 {
		return MoELayerStats{}, fmt.Errorf("layer %d out of range", layer)
	}
	var out MoELayerStats
	var err error
	if cerr := e.call("moe_layer_stats", func() {
		var st C.eng_moe_layer_stats
		if err = e.status("moe_layer_stats", C.eng_engine_moe_layer_stats(e.h, C.int32_t(layer), &st)); err == nil {
			out = MoELayerStats{Calls: uint64(st.calls), DispatchBytes: uint64(st.dispatch_bytes),
				CombineBytes: uint64(st.combine_bytes), DispatchMS: float64(st.dispatch_ms), CombineMS: float64(st.combine_ms)}
		}
	}); cerr != nil {
		return MoELayerStats{}, cerr
	}
	return out, err
}
