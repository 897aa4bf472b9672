// Package config loads kvroute's configuration with viper: a YAML file, every key
// overridable by a KVROUTE_* environment variable and by a command-line flag of the
// same dotted name, validated at start with errors that name the key and the problem.
//
// Precedence (highest first): flag, environment, file, default. The key
// "router.ticket_ttl" is set by --router.ticket_ttl=5m, by KVROUTE_ROUTER_TICKET_TTL=5m,
// or in the file as router: {ticket_ttl: 5m}. List-valued keys (workers, models) take
// YAML or JSON text from a flag or the environment:
// KVROUTE_WORKERS='[{address: "127.0.0.1:8001", models: [qwen3]}]'.
//
// Defaults live in one place: Default(). docs/configuration.md is the reference.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix prefixes every environment variable.
const EnvPrefix = "KVROUTE"

// Config is kvroute's whole configuration. Each section is defined in its own file.
type Config struct {
	Server    Server    `mapstructure:"server"`
	ExtProc   ExtProc   `mapstructure:"extproc"`
	Router    Router    `mapstructure:"router"`
	Index     Index     `mapstructure:"index"`
	Scoring   Scoring   `mapstructure:"scoring"`
	Discovery Discovery `mapstructure:"discovery"`
	Models    []Model   `mapstructure:"models"`
	Workers   []Worker  `mapstructure:"workers"`
	Tokenize  Tokenize  `mapstructure:"tokenize"`
	Proxy     Proxy     `mapstructure:"proxy"`
	Admission Admission `mapstructure:"admission"`
	Tracing   Tracing   `mapstructure:"tracing"`
	Peers     Peers     `mapstructure:"peers"`
	Classify  Classify  `mapstructure:"classify"`
}

// Default returns the configuration with every default set.
func Default() Config {
	return Config{
		Server:    defaultServer(),
		ExtProc:   defaultExtProc(),
		Router:    defaultRouter(),
		Index:     defaultIndex(),
		Scoring:   defaultScoring(),
		Discovery: defaultDiscovery(),
		Proxy:     defaultProxy(),
		Admission: defaultAdmission(),
		Tracing:   defaultTracing(),
		Peers:     defaultPeers(),
		Classify:  defaultClassify(),
	}
}

// Validate checks every section and cross-section rules. The error lists every problem,
// each as "key: problem".
func (c *Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(c.Server.validate())
	add(c.ExtProc.validate())
	add(c.Router.validate())
	add(c.Index.validate())
	add(c.Scoring.validate())
	add(c.Discovery.validate())
	add(c.Tracing.validate())
	add(validateModels(c.Models))
	add(validateTokenize(c.Tokenize))
	add(validateWorkers(c.Workers, c.Models, c.Discovery))
	add(validatePools(c.Workers, c.Models, c.Discovery))
	add(c.Proxy.validate())
	add(c.Admission.validate())
	add(validateBodyFitsGRPC(c.Server, c.ExtProc))
	add(c.Peers.validate(c.Index))
	add(c.Classify.validate(c.Models))
	return errors.Join(errs...)
}

// FieldError is one invalid key.
type FieldError struct {
	Key     string // dotted key, with [i] for list elements: workers[2].address
	Problem string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Problem }

func fieldErr(key, format string, args ...any) error {
	return &FieldError{Key: key, Problem: fmt.Sprintf(format, args...)}
}

// Flags returns a flag set with one flag per configuration key (dotted names), plus
// --config for the file path. Values are strings parsed like the environment's.
func Flags(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.String("config", "", "path to the YAML configuration file (env KVROUTE_CONFIG)")
	for _, kv := range flatten(Default()) {
		fs.String(kv.key, "", fmt.Sprintf("overrides %s (env %s; default %s)", kv.key, envName(kv.key), showDefault(kv.val)))
	}
	return fs
}

func envName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

func showDefault(v any) string {
	switch x := v.(type) {
	case string:
		if x == "" {
			return `""`
		}
		return x
	case time.Duration:
		return x.String()
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Slice && rv.Len() == 0 {
		return "[]"
	}
	return fmt.Sprint(v)
}

// Load reads the configuration: defaults, then the file (--config flag, else
// KVROUTE_CONFIG, else none), then the environment, then the flags already parsed in fs
// (nil: none). lookupEnv nil means os.LookupEnv. The result is validated.
func Load(fs *pflag.FlagSet, lookupEnv func(string) (string, bool)) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	v := viper.New()
	v.SetConfigType("yaml")
	leaves := flatten(Default())
	for _, kv := range leaves {
		v.SetDefault(kv.key, kv.val)
	}
	path := ""
	if fs != nil {
		path, _ = fs.GetString("config")
	}
	if path == "" {
		path, _ = lookupEnv(EnvPrefix + "_CONFIG")
	}
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		err = v.ReadConfig(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("config: %s: %w", path, err)
		}
	}
	for _, kv := range leaves {
		raw, src, ok := "", "", false
		if fs != nil {
			if f := fs.Lookup(kv.key); f != nil && f.Changed {
				raw, src, ok = f.Value.String(), "--"+kv.key, true
			}
		}
		if !ok {
			if s, found := lookupEnv(envName(kv.key)); found {
				raw, src, ok = s, envName(kv.key), true
			}
		}
		if !ok {
			continue
		}
		if k := reflect.TypeOf(kv.val).Kind(); k == reflect.Slice || k == reflect.Map {
			var x any
			if err := yaml.Unmarshal([]byte(raw), &x); err != nil {
				return nil, fieldErr(kv.key, "%s is not valid YAML/JSON: %v", src, err)
			}
			v.Set(kv.key, x)
		} else {
			v.Set(kv.key, raw)
		}
	}
	var c Config
	hook := mapstructure.ComposeDecodeHookFunc(
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)
	if err := v.UnmarshalExact(&c, viper.DecodeHook(hook), func(dc *mapstructure.DecoderConfig) {
		dc.WeaklyTypedInput = true
	}); err != nil {
		// mapstructure names the Go type for unknown top-level keys; say it in our terms.
		msg := strings.ReplaceAll(err.Error(), "'config.Config' has invalid keys:", "unknown configuration keys:")
		msg = strings.ReplaceAll(msg, "has invalid keys:", "has unknown keys:")
		return nil, fmt.Errorf("config: %s", msg)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: invalid:\n%w", err)
	}
	return &c, nil
}

type leaf struct {
	key string
	val any
}

// flatten lists every leaf key of c (structs are descended; slices and maps are leaves)
// with its default value, sorted by key.
func flatten(c Config) []leaf {
	var out []leaf
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := f.Tag.Get("mapstructure")
			if name == "" || name == "-" {
				continue
			}
			key := name
			if prefix != "" {
				key = prefix + "." + name
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeOf(time.Duration(0)) {
				walk(key, fv)
				continue
			}
			val := fv.Interface()
			if fv.Kind() == reflect.Slice && fv.IsNil() {
				val = reflect.MakeSlice(fv.Type(), 0, 0).Interface()
			}
			out = append(out, leaf{key, val})
		}
	}
	walk("", reflect.ValueOf(c))
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// CheckEnviron returns an error naming every KVROUTE_* variable in environ (as
// os.Environ gives it) that is not a configuration key's variable: a misspelt variable
// would otherwise be ignored silently.
func CheckEnviron(environ []string) error {
	known := map[string]bool{EnvPrefix + "_CONFIG": true}
	for _, kv := range flatten(Default()) {
		known[envName(kv.key)] = true
	}
	var unknown []string
	for _, e := range environ {
		name, _, _ := strings.Cut(e, "=")
		if strings.HasPrefix(name, EnvPrefix+"_") && !known[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("config: unknown environment variables %s (every key's variable is listed by --help)", strings.Join(unknown, ", "))
}

// Values returns every key of c with its effective value, sorted by key; list-valued
// keys are rendered as JSON. `kvroute config` prints them.
func Values(c *Config) []struct{ Key, Value string } {
	var out []struct{ Key, Value string }
	for _, kv := range flatten(*c) {
		v := showDefault(kv.val)
		if k := reflect.TypeOf(kv.val).Kind(); k == reflect.Slice || k == reflect.Map {
			if b, err := json.Marshal(plain(reflect.ValueOf(kv.val))); err == nil {
				v = string(b)
			}
		}
		out = append(out, struct{ Key, Value string }{kv.key, v})
	}
	return out
}

// plain converts v to maps, slices and scalars keyed by mapstructure tags (the
// configuration's own key names), for printing.
func plain(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Struct:
		if d, ok := v.Interface().(time.Duration); ok {
			return d.String()
		}
		m := map[string]any{}
		for i := 0; i < v.NumField(); i++ {
			if name := v.Type().Field(i).Tag.Get("mapstructure"); name != "" && name != "-" {
				m[name] = plain(v.Field(i))
			}
		}
		return m
	case reflect.Slice:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = plain(v.Index(i))
		}
		return out
	case reflect.Int64:
		if d, ok := v.Interface().(time.Duration); ok {
			return d.String()
		}
	}
	return v.Interface()
}

// Keys returns every configuration key with its default, for the reference docs.
func Keys() []struct {
	Key, Env, Default string
} {
	var out []struct{ Key, Env, Default string }
	for _, kv := range flatten(Default()) {
		out = append(out, struct{ Key, Env, Default string }{kv.key, envName(kv.key), showDefault(kv.val)})
	}
	return out
}
