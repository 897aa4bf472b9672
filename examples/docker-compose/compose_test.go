// Package compose tests the docker-compose demo without Docker: the compose file, the
// Envoy and kvroute configurations it mounts, the Prometheus and Grafana provisioning,
// and the Dockerfiles it builds must agree with each other and with the Makefile.
package compose

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy"
)

type composeFile struct {
	Name       string             `yaml:"name"`
	Services   map[string]service `yaml:"services"`
	Networks   map[string]network `yaml:"networks"`
	Extensions map[string]any     `yaml:",inline"` // x-* anchors only
}

type service struct {
	Image       string            `yaml:"image"`
	Build       *build            `yaml:"build"`
	Command     []string          `yaml:"command"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   []string          `yaml:"depends_on"`
	Environment map[string]string `yaml:"environment"`
	Restart     string            `yaml:"restart"`
	Networks    map[string]struct {
		IPv4Address string   `yaml:"ipv4_address"`
		Aliases     []string `yaml:"aliases"`
	} `yaml:"networks"`
}

type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type network struct {
	IPAM struct {
		Config []struct {
			Subnet string `yaml:"subnet"`
		} `yaml:"config"`
	} `yaml:"ipam"`
}

const composePath = "docker-compose.yaml"

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	f, err := os.Open(composePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var c composeFile
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", composePath, err)
	}
	for k := range c.Extensions {
		if !strings.HasPrefix(k, "x-") {
			t.Errorf("%s: unknown top-level key %q", composePath, k)
		}
	}
	return &c
}

// mount returns the host path (relative to the repository's test dir) mounted at target.
func (s service) mount(t *testing.T, name, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			return parts[0]
		}
	}
	t.Fatalf("service %s mounts nothing at %s", name, target)
	return ""
}

// flag returns the value after name in the command ("--port", "8000") or of name=value.
func (s service) flag(name string) (string, bool) {
	for i, a := range s.Command {
		if a == name && i+1 < len(s.Command) {
			return s.Command[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func (s service) ip(t *testing.T, name string) string {
	t.Helper()
	n, ok := s.Networks["llm"]
	if !ok || n.IPv4Address == "" {
		t.Fatalf("service %s needs a fixed ipv4_address on network llm", name)
	}
	return n.IPv4Address
}

// publishes reports whether the service publishes container port p.
func (s service) publishes(p int) bool {
	for _, x := range s.Ports {
		parts := strings.Split(x, ":")
		if parts[len(parts)-1] == strconv.Itoa(p) || parts[len(parts)-1] == strconv.Itoa(p)+"/tcp" {
			return true
		}
	}
	return false
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return n
}

var vllmServices = []string{"vllm-1", "vllm-2", "vllm-3"}

func TestComposeServicesAndFiles(t *testing.T) {
	c := loadCompose(t)
	for _, name := range append([]string{"envoy", "kvroute", "prometheus", "grafana"}, vllmServices...) {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("the demo needs service %s", name)
		}
	}
	subnet, err := netip.ParsePrefix(c.Networks["llm"].IPAM.Config[0].Subnet)
	if err != nil {
		t.Fatalf("network llm needs an ipam subnet: %v", err)
	}
	ips := map[string]string{}
	for name, s := range c.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("%s: needs an image or a build", name)
		}
		for _, v := range s.Volumes {
			if src := strings.Split(v, ":")[0]; strings.HasPrefix(src, ".") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s mounts %s, which does not exist: %v", name, src, err)
				}
			}
		}
		if b := s.Build; b != nil {
			if _, err := os.Stat(filepath.Join(b.Context, b.Dockerfile)); err != nil {
				t.Errorf("%s: Dockerfile: %v", name, err)
			}
			if _, err := os.Stat(filepath.Join(b.Context, "go.mod")); err != nil {
				t.Errorf("%s: build context must be the repository root: %v", name, err)
			}
		}
		for _, d := range s.DependsOn {
			if _, ok := c.Services[d]; !ok {
				t.Errorf("%s depends on unknown service %s", name, d)
			}
		}
		ip := s.ip(t, name)
		a, err := netip.ParseAddr(ip)
		if err != nil || !subnet.Contains(a) {
			t.Errorf("%s: address %s is not in subnet %s", name, ip, subnet)
		}
		if other, dup := ips[ip]; dup {
			t.Errorf("%s and %s share address %s", name, other, ip)
		}
		ips[ip] = name
	}
}

// loadKVRoute loads the kvroute configuration the kvroute service mounts, exactly as
// kvroute does (defaults, file, validation).
func loadKVRoute(t *testing.T, c *composeFile) *config.Config {
	t.Helper()
	kv := c.Services["kvroute"]
	target, ok := kv.flag("--config")
	if !ok {
		t.Fatal("kvroute's command must name --config")
	}
	fs := config.Flags("kvroute serve")
	if err := fs.Parse([]string{"--config", kv.mount(t, "kvroute", target)}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(fs, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("kvroute would refuse its compose configuration: %v", err)
	}
	return cfg
}

// Tracing: kvroute exports OTLP to a compose service that receives OTLP on that port
// (Jaeger v2 all-in-one: 4317 gRPC, 4318 HTTP) and publishes its UI.
func TestTracesGoToJaeger(t *testing.T) {
	c := loadCompose(t)
	cfg := loadKVRoute(t, c)
	if !cfg.Tracing.Enabled {
		t.Fatal("kvroute.yaml: tracing.enabled is off; the demo shows each decision's trace in Jaeger")
	}
	host, p, err := net.SplitHostPort(cfg.Tracing.Endpoint)
	if err != nil {
		t.Fatalf("tracing.endpoint %q: %v", cfg.Tracing.Endpoint, err)
	}
	j, ok := c.Services[host]
	if !ok {
		t.Fatalf("tracing.endpoint names %q, not a compose service", host)
	}
	want := map[string]string{"grpc": "4317", "http/protobuf": "4318"}[cfg.Tracing.Protocol]
	if p != want || !strings.HasPrefix(j.Image, "jaegertracing/jaeger:2") {
		t.Errorf("tracing.endpoint %s over %s: Jaeger v2 (%s) receives it on %s", cfg.Tracing.Endpoint, cfg.Tracing.Protocol, j.Image, want)
	}
	if !cfg.Tracing.Insecure {
		t.Error("the demo's Jaeger has no TLS: tracing.insecure must be true")
	}
	if !j.publishes(16686) {
		t.Error("the Jaeger UI (16686) should be published")
	}
	if !slices.Contains(c.Services["kvroute"].DependsOn, host) {
		t.Errorf("kvroute should depend on %s", host)
	}
}

func TestKVRouteConfigMatchesWorkers(t *testing.T) {
	c := loadCompose(t)
	cfg := loadKVRoute(t, c)
	if len(cfg.Workers) != len(vllmServices) {
		t.Fatalf("kvroute.yaml lists %d workers, compose runs %d", len(cfg.Workers), len(vllmServices))
	}
	for _, w := range cfg.Workers {
		s, ok := c.Services[w.Name]
		if !ok {
			t.Errorf("worker %s is not a compose service", w.Name)
			continue
		}
		p, _ := s.flag("--port")
		kvp, _ := s.flag("--kv-port")
		if want := net.JoinHostPort(s.ip(t, w.Name), p); w.Address != want {
			t.Errorf("worker %s: address %s, but the service listens on %s", w.Name, w.Address, want)
		}
		if want := "tcp://" + net.JoinHostPort(s.ip(t, w.Name), kvp); w.KVEvents.Endpoint != want {
			t.Errorf("worker %s: kv_events.endpoint %s, but the service publishes on %s", w.Name, w.KVEvents.Endpoint, want)
		}
		rp, _ := s.flag("--kv-replay-port")
		if want := "tcp://" + net.JoinHostPort(s.ip(t, w.Name), rp); w.KVEvents.ReplayEndpoint != want {
			t.Errorf("worker %s: kv_events.replay_endpoint %s, but the service replays on %s", w.Name, w.KVEvents.ReplayEndpoint, want)
		}
		if h, _ := s.flag("--host"); h != "0.0.0.0" {
			t.Errorf("worker %s: vllm-sim listens on 127.0.0.1 unless --host 0.0.0.0; got %q", w.Name, h)
		}
		if m, _ := s.flag("--model"); len(cfg.Models) == 0 || m != cfg.Models[0].Name {
			t.Errorf("worker %s serves %q, kvroute knows %v", w.Name, m, cfg.Models)
		}
	}
	if !c.Services["kvroute"].publishes(port(t, cfg.Server.AdminAddr)) {
		t.Errorf("kvroute's admin port %s should be published", cfg.Server.AdminAddr)
	}
}

func TestEnvoyConfigMatchesKVRoute(t *testing.T) {
	c := loadCompose(t)
	cfg := loadKVRoute(t, c)
	ev := c.Services["envoy"]
	target, ok := ev.flag("-c")
	if !ok {
		t.Fatal("envoy's command must name -c")
	}
	b, err := envoy.LoadBootstrap(ev.mount(t, "envoy", target))
	if err != nil {
		t.Fatal(err)
	}
	if err := envoy.Check(envoy.Expect{DestinationHeader: cfg.ExtProc.DestinationHeader, MetadataNamespace: cfg.ExtProc.MetadataNamespace}, b); err != nil {
		t.Fatalf("Envoy disagrees with the compose kvroute.yaml: %v", err)
	}
	for _, cl := range b.GetStaticResources().GetClusters() {
		if cl.GetType() != clusterv3.Cluster_STRICT_DNS {
			continue
		}
		for _, le := range cl.GetLoadAssignment().GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if _, ok := c.Services[sa.GetAddress()]; !ok {
					// A network alias shared by services resolves to all of them (Envoy's
					// fail-open fallback cluster "vllm" load balances over the workers).
					var with []string
					for name, s := range c.Services {
						if slices.Contains(s.Networks["llm"].Aliases, sa.GetAddress()) {
							with = append(with, name)
						}
					}
					slices.Sort(with)
					if !slices.Equal(with, vllmServices) {
						t.Errorf("cluster %s: host %q is neither a compose service nor an alias of exactly the workers %v (got %v)", cl.GetName(), sa.GetAddress(), vllmServices, with)
					}
				}
				if sa.GetAddress() == "kvroute" {
					if int(sa.GetPortValue()) != port(t, cfg.Server.ExtProcAddr) {
						t.Errorf("cluster %s: port %d, kvroute's ext_proc listens on %s", cl.GetName(), sa.GetPortValue(), cfg.Server.ExtProcAddr)
					}
					if hc := lb.GetEndpoint().GetHealthCheckConfig().GetPortValue(); int(hc) != port(t, cfg.Server.HealthAddr) {
						t.Errorf("cluster %s: health check port %d, kvroute's gRPC health listens on %s", cl.GetName(), hc, cfg.Server.HealthAddr)
					}
				}
			}
		}
	}
	var lports []int
	for _, l := range b.GetStaticResources().GetListeners() {
		lports = append(lports, int(l.GetAddress().GetSocketAddress().GetPortValue()))
	}
	lports = append(lports, int(b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue()))
	for _, p := range lports {
		if !ev.publishes(p) {
			t.Errorf("envoy listens on %d but the compose file does not publish it", p)
		}
	}
}

func TestPrometheusTargetsAreServices(t *testing.T) {
	c := loadCompose(t)
	cfg := loadKVRoute(t, c)
	pr := c.Services["prometheus"]
	target := mustFlag(t, pr, "--config.file")
	text, err := os.ReadFile(pr.mount(t, "prometheus", target))
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(text, &pc); err != nil {
		t.Fatal(err)
	}
	listens := map[string]int{"kvroute": port(t, cfg.Server.AdminAddr), "envoy": 9901}
	for _, v := range vllmServices {
		p, _ := c.Services[v].flag("--port")
		listens[v], _ = strconv.Atoi(p)
	}
	seen := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				h, _, _ := net.SplitHostPort(tg)
				want, ok := listens[h]
				if !ok {
					t.Errorf("job %s scrapes %s, which is not a scraped service", sc.JobName, tg)
					continue
				}
				if port(t, tg) != want {
					t.Errorf("job %s scrapes %s, but %s serves metrics on %d", sc.JobName, tg, h, want)
				}
				seen[h] = true
			}
		}
	}
	for h := range listens {
		if !seen[h] {
			t.Errorf("prometheus does not scrape %s", h)
		}
	}
}

func mustFlag(t *testing.T, s service, name string) string {
	t.Helper()
	v, ok := s.flag(name)
	if !ok {
		t.Fatalf("command %v lacks %s", s.Command, name)
	}
	return v
}

func TestGrafanaProvisioning(t *testing.T) {
	c := loadCompose(t)
	g := c.Services["grafana"]
	prov := g.mount(t, "grafana", "/etc/grafana/provisioning")
	var dp struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(prov, "dashboards", "kvroute.yaml"), &dp)
	if len(dp.Providers) != 1 {
		t.Fatalf("want one dashboard provider, got %d", len(dp.Providers))
	}
	dashDir := g.mount(t, "grafana", dp.Providers[0].Options.Path)
	home := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	rel, ok := strings.CutPrefix(home, dp.Providers[0].Options.Path+"/")
	if !ok {
		t.Fatalf("home dashboard %s is outside the provisioned path", home)
	}
	if _, err := os.Stat(filepath.Join(dashDir, rel)); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	var ds struct {
		Datasources []struct {
			UID, URL, Type string
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yaml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("want one prometheus datasource, got %+v", ds.Datasources)
	}
	u := strings.TrimPrefix(ds.Datasources[0].URL, "http://")
	h, _, _ := net.SplitHostPort(u)
	pr, ok := c.Services[h]
	if !ok {
		t.Fatalf("datasource host %s is not a service", h)
	}
	if want := port(t, mustFlag(t, pr, "--web.listen-address")); port(t, u) != want {
		t.Errorf("datasource port %d, prometheus listens on %d", port(t, u), want)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(text)))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// makeVars reads simple "NAME := value" / "NAME ?= value" / "NAME = value" lines.
func makeVars(t *testing.T, path string) map[string]string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	re := regexp.MustCompile(`^([A-Z_]+)\s*[:?]?=\s*(.*)$`)
	for _, line := range strings.Split(string(text), "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			vars[m[1]] = strings.TrimSpace(m[2])
		}
	}
	return vars
}

// expandMake expands $(NAME) references with vars, overriding some names.
func expandMake(s string, vars, override map[string]string) string {
	re := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for i := 0; i < 10 && re.MatchString(s); i++ {
		s = re.ReplaceAllStringFunc(s, func(m string) string {
			name := m[2 : len(m)-1]
			if v, ok := override[name]; ok {
				return v
			}
			return vars[name]
		})
	}
	return s
}

// dockerfile is one parsed Dockerfile: its stages and RUN commands (continuations joined).
type dockerfile struct {
	froms, runs, users []string
	lastStageUsers     []string
}

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	joined := strings.ReplaceAll(string(text), "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			d.froms = append(d.froms, rest)
			d.lastStageUsers = nil
		case "RUN":
			d.runs = append(d.runs, strings.TrimSpace(rest))
		case "USER":
			d.users = append(d.users, rest)
			d.lastStageUsers = append(d.lastStageUsers, rest)
		}
	}
	return d
}

func TestDockerfilesBuildLikeTheMakefile(t *testing.T) {
	vars := makeVars(t, "../../Makefile")
	gobuild, ok := vars["GOBUILD"]
	if !ok {
		t.Fatal("Makefile has no GOBUILD")
	}
	// Inside the image: the go on PATH, and the VERSION build argument.
	want := expandMake(gobuild, vars, map[string]string{"GO": "go", "VERSION": "${VERSION}"})
	for _, tc := range []struct{ file, cmd string }{
		{"../../docker/kvroute.Dockerfile", "kvroute"},
		{"../../docker/vllm-sim.Dockerfile", "vllm-sim"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			d := parseDockerfile(t, tc.file)
			var builds []string
			for _, r := range d.runs {
				if strings.Contains(r, "go build") {
					builds = append(builds, r)
				}
			}
			if len(builds) != 1 {
				t.Fatalf("want exactly one go build, got %q", builds)
			}
			wantLine := fmt.Sprintf("%s -o /out/%s ./cmd/%s", want, tc.cmd, tc.cmd)
			if builds[0] != wantLine {
				t.Errorf("the image must build like `make build`:\n got  %s\n want %s", builds[0], wantLine)
			}
			if len(d.froms) < 2 {
				t.Errorf("multi-stage build expected (build + runtime), got %d stages", len(d.froms))
			}
			if last := d.froms[len(d.froms)-1]; strings.Contains(last, "golang") {
				t.Errorf("the runtime stage must not be the Go toolchain image: %s", last)
			}
			if len(d.lastStageUsers) == 0 || slices.ContainsFunc(d.lastStageUsers, func(u string) bool {
				u = strings.Split(u, ":")[0]
				return u == "0" || u == "root"
			}) {
				t.Errorf("the runtime stage must run as a non-root USER, got %q", d.lastStageUsers)
			}
			if _, err := os.Stat("../../cmd/" + tc.cmd); err != nil {
				t.Logf("note: ./cmd/%s does not exist on this branch yet (%v)", tc.cmd, err)
			}
		})
	}
}

// The admin port is bound on every interface of the container (Prometheus scrapes it
// over the compose network), so /debug/* must need server.admin_token: the compose file
// sets KVROUTE_SERVER_ADMIN_TOKEN from a variable compose requires (${VAR:?…}), never
// a literal, and publishes the admin port on the host's loopback only.
func TestAdminNeedsTokenWhenBoundWide(t *testing.T) {
	c := loadCompose(t)
	cfg := loadKVRoute(t, c)
	host, _, err := net.SplitHostPort(cfg.Server.AdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return // loopback: nothing to protect
	}
	if cfg.Server.AdminToken != "" {
		t.Fatal("server.admin_token is a literal in kvroute.yaml: take it from the environment")
	}
	kv := c.Services["kvroute"]
	tok := kv.Environment["KVROUTE_SERVER_ADMIN_TOKEN"]
	if !regexp.MustCompile(`^\$\{[A-Z_]+:\?.+\}$`).MatchString(tok) {
		t.Fatalf("admin on %s without a required KVROUTE_SERVER_ADMIN_TOKEN (${VAR:?message}); got %q", cfg.Server.AdminAddr, tok)
	}
	for _, p := range kv.Ports {
		if strings.HasSuffix(p, ":"+strconv.Itoa(port(t, cfg.Server.AdminAddr))) && !strings.HasPrefix(p, "127.0.0.1:") {
			t.Errorf("admin port published as %q: bind it to the host's 127.0.0.1", p)
		}
	}
}
