package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// The remote path asks a worker serving the model for the ids: vLLM's POST /tokenize
// (vllm/entrypoints/openai/serving_tokenization.py), chat form
// {"model","messages","tools","add_generation_prompt","continue_final_message",
// "chat_template_kwargs","add_special_tokens"} or completion form {"model","prompt",
// "add_special_tokens"}; the answer is {"count","max_model_len","tokens":[…]}.

// maxRemoteBody bounds a /tokenize response (ids of a 1M-token prompt are ~8 MB).
const maxRemoteBody = 64 << 20

type remoteAnswer struct {
	Count  int      `json:"count"`
	Tokens []uint32 `json:"tokens"`
}

// remote asks the model's workers' /tokenize, in the order Addresses gives, skipping
// workers in backoff: up to maxRemoteTries workers, each call bounded by
// RemoteTimeout and all of them together by RemoteBudget. A client error (4xx) or
// the caller's cancel ends the search: another worker would answer the same.
func (s *Service) remote(ctx context.Context, st *modelState, req *request.Request) (Result, string) {
	if s.addrs == nil {
		return Result{}, ReasonNoWorker
	}
	addrs := s.addrs(st.cfg.Name)
	if len(addrs) == 0 {
		return Result{}, ReasonNoWorker
	}
	bodies, err := remoteBodies(req)
	if err != nil {
		return Result{}, ReasonContent
	}
	timeout := st.cfg.RemoteTimeout // defaulted by NewService (ModelConfig.WithDefaults)
	bctx, cancel := context.WithTimeout(ctx, st.cfg.RemoteBudget)
	defer cancel()
	why, tried := ReasonBackoff, 0
	for _, addr := range addrs {
		if tried == maxRemoteTries {
			break
		}
		if s.skipWorker(addr) {
			continue
		}
		tried++
		var res Result
		res, why = s.remoteAt(bctx, addr, bodies, timeout)
		s.workerOutcome(addr, why)
		if why == "" {
			return res, ""
		}
		if why == ReasonClient || why == ReasonCanceled {
			break
		}
		if bctx.Err() != nil {
			if ctx.Err() == nil {
				why = ReasonTimeout // the budget is spent
			}
			break
		}
	}
	return Result{}, why
}

// remoteAt tokenizes the request's bodies at one worker, each call bounded by timeout.
func (s *Service) remoteAt(ctx context.Context, addr string, bodies [][]byte, timeout time.Duration) (Result, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var res Result
	for i, body := range bodies {
		ids, why := s.callTokenize(ctx, addr, body)
		if why != "" {
			return Result{}, why
		}
		if i == 0 {
			res.Tokens = ids
		}
		res.PromptTokens += len(ids)
	}
	return res, ""
}

// remoteBodies builds one /tokenize body per prompt (one for chat).
func remoteBodies(req *request.Request) ([][]byte, error) {
	switch req.API {
	case request.APIChat, request.APIMessages:
		msgs := req.Messages
		if req.API == request.APIMessages {
			var err error
			if msgs, err = anthropicToChat(req.System, req.Messages); err != nil {
				return nil, err
			}
		}
		b := map[string]any{"model": req.Model, "messages": msgs}
		if len(req.Tools) > 0 {
			b["tools"] = req.Tools // jsonvalue.Value marshals in the client's key order
		}
		if req.AddGenerationPrompt != nil {
			b["add_generation_prompt"] = *req.AddGenerationPrompt
		}
		if req.ContinueFinalMessage {
			b["continue_final_message"] = true
		}
		kw := append([]jsonvalue.Member(nil), req.ChatTemplateKwargs...)
		if req.ReasoningEffort != "" {
			if _, ok := req.Kwarg("enable_thinking"); !ok {
				kw = append(kw, jsonvalue.Member{Key: "enable_thinking", Value: jsonvalue.BoolValue(req.ReasoningEffort != "none")})
			}
			kw = append(kw, jsonvalue.Member{Key: "reasoning_effort", Value: jsonvalue.StringValue(req.ReasoningEffort)})
		}
		if len(kw) > 0 {
			b["chat_template_kwargs"] = jsonvalue.ObjectValue(kw...)
		}
		if req.AddSpecialTokens != nil {
			b["add_special_tokens"] = *req.AddSpecialTokens
		}
		data, err := json.Marshal(b)
		return [][]byte{data}, err
	case request.APICompletions:
		out := make([][]byte, 0, len(req.Prompts))
		for _, p := range req.Prompts {
			b := map[string]any{"model": req.Model, "prompt": p}
			if req.AddSpecialTokens != nil {
				b["add_special_tokens"] = *req.AddSpecialTokens
			}
			data, err := json.Marshal(b)
			if err != nil {
				return nil, err
			}
			out = append(out, data)
		}
		if len(out) == 0 {
			return nil, ErrContent
		}
		return out, nil
	}
	return nil, ErrContent
}

func (s *Service) callTokenize(ctx context.Context, addr string, body []byte) ([]uint32, string) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, ReasonTransport
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(hr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ReasonTimeout
		}
		if ctx.Err() != nil {
			return nil, ReasonCanceled
		}
		return nil, ReasonTransport
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		if clientStatus(resp.StatusCode) {
			return nil, ReasonClient
		}
		return nil, ReasonHTTP
	}
	var a remoteAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRemoteBody)).Decode(&a); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ReasonTimeout
		}
		return nil, ReasonDecode
	}
	if a.Tokens == nil || (a.Count != 0 && a.Count != len(a.Tokens)) {
		return nil, ReasonDecode
	}
	return a.Tokens, ""
}

// clientStatus reports whether a /tokenize status is the request's fault: 4xx, except
// 404 and 405 (the worker has no such route: not vLLM, or an older one), 408 and 429
// (the worker is slow or overloaded), which count against the worker.
func clientStatus(code int) bool {
	switch code {
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	}
	return code >= 400 && code < 500
}
