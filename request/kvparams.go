package request

import (
	"bytes"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// kvParamsKey finds a top-level kv_transfer_params in a body cheaply before parsing.
var kvParamsKey = []byte(`"kv_transfer_params"`)

// WithoutKVTransferParams returns body without a client's top-level
// kv_transfer_params member, and whether it removed one. That member tells a vLLM
// worker with a KV connector to read KV from, or hold it for, a host the client names
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// get_num_new_matched_tokens / request_finished): only kvroute's own prefill/decode
// exchange may set it. Only chat and completions bodies carry it (vLLM's
// ChatCompletionRequest and CompletionRequest); other APIs, bodies without the key and
// bodies that do not parse as an object (maxElems bounds each array, 0 none) are
// returned as they are. The other members keep their order and bytes.
func WithoutKVTransferParams(body []byte, api API, maxElems int) ([]byte, bool) {
	if (api != APIChat && api != APICompletions) || !bytes.Contains(body, kvParamsKey) {
		return body, false
	}
	root, err := jsonvalue.ParseValueLimit(body, maxElems)
	if err != nil || root.Kind() != jsonvalue.Object {
		return body, false
	}
	if _, ok := root.Get("kv_transfer_params"); !ok {
		return body, false // the key appears inside a string or nested value
	}
	old := root.Members()
	keep := make([]jsonvalue.Member, 0, len(old))
	for _, m := range old {
		if m.Key != "kv_transfer_params" {
			keep = append(keep, m)
		}
	}
	return jsonvalue.ObjectValue(keep...).AppendJSON(nil), true
}
