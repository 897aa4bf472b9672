// Package envoy holds kvroute's Envoy bootstrap files and the checks that keep them
// correct: each file loads strictly into go-control-plane's Bootstrap, every nested
// typed_config passes its protoc-gen-validate rules, and the parts kvroute relies on
// (ext_proc cluster, ORIGINAL_DST cluster, destination header, processing modes) agree
// with kvroute's configuration. The Istio example reuses the same checks on the Envoy
// protos embedded in its EnvoyFilter.
package envoy

import (
	"errors"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	// Extension types that appear as typed_config in kvroute's Envoy files; protojson
	// resolves "@type" through the global registry, so each must be linked in.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// ErrInvalid marks a protoc-gen-validate rule violation found by ValidateDeep.
var ErrInvalid = errors.New("envoy: invalid message")

// Unmarshal decodes YAML (or JSON) text into m strictly: unknown fields and unknown
// "@type" URLs are errors, as they are for Envoy itself.
func Unmarshal(text []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSON(text)
	if err != nil {
		return fmt.Errorf("envoy: yaml: %w", err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, m); err != nil {
		return fmt.Errorf("envoy: %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// LoadBootstrap reads an Envoy bootstrap YAML file strictly and validates it deeply.
func LoadBootstrap(path string) (*bootstrapv3.Bootstrap, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := Unmarshal(text, &b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := ValidateDeep(&b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &b, nil
}

// ValidateDeep runs ValidateAll on m and on every message packed in a
// google.protobuf.Any anywhere below it (typed_config, typed_extension_protocol_options
// …), recursively. A message's own ValidateAll checks its nested fields but never looks
// inside an Any, so a bad filter config would otherwise pass.
func ValidateDeep(m proto.Message) error {
	return Walk(m, func(m proto.Message, packed bool) error {
		if !packed {
			// A message's own ValidateAll already descends into its ordinary fields;
			// only roots and Any payloads need their own call.
			return nil
		}
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrInvalid, m.ProtoReflect().Descriptor().FullName(), err)
			}
		}
		return nil
	})
}

// Walk calls visit for m (packed=true: m is a root or was unpacked from an Any) and for
// every message below it, unpacking each google.protobuf.Any into its registered type
// and walking that too. An Any with an unregistered type is an error.
func Walk(m proto.Message, visit func(m proto.Message, packed bool) error) error {
	return walk(m.ProtoReflect(), true, visit)
}

func walk(m protoreflect.Message, packed bool, visit func(proto.Message, bool) error) error {
	if !m.IsValid() {
		return nil
	}
	if err := visit(m.Interface(), packed); err != nil {
		return err
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("envoy: unpack %s: %w", a.GetTypeUrl(), err)
		}
		return walk(inner.ProtoReflect(), true, visit)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = walk(l.Get(i).Message(), false, visit)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = walk(mv.Message(), false, visit)
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = walk(v.Message(), false, visit)
		}
		return err == nil
	})
	return err
}
