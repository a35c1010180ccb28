package check

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The manifests checked: the directory above this module.
const dir = ".."

// The objects the design names.
const (
	nodesName    = "sluice"          // the Deployment of Sluice nodes
	headlessName = "sluice-acceptor" // the headless Service SDKs resolve
	clientsName  = "sluice"          // the Service clients connect to
	exampleName  = "api"             // the example service, with the Go SDK
	configKey    = "sluice.toml"
)

// deployment is everything the tests below read, loaded once.
type deployment struct {
	m        *Manifests
	nodes    *appsv1.Deployment
	node     corev1.Container
	headless *corev1.Service
	clients  *corev1.Service
	example  *appsv1.Deployment
	config   *Config
}

func load(t *testing.T) deployment {
	t.Helper()
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := deployment{m: m, nodes: m.Deployment(nodesName), headless: m.Service(headlessName), clients: m.Service(clientsName), example: m.Deployment(exampleName)}
	if d.nodes == nil || d.headless == nil || d.clients == nil || d.example == nil {
		t.Fatalf("want Deployments %q and %q and Services %q and %q", nodesName, exampleName, headlessName, clientsName)
	}
	if n := len(d.nodes.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the node pods have %d containers, want 1", n)
	}
	d.node = d.nodes.Spec.Template.Spec.Containers[0]
	d.config = nodeConfig(t, m, d.nodes)
	return d
}

// nodeConfig is the configuration the node container runs: the ConfigMap mounted where its
// -c argument points.
func nodeConfig(t *testing.T, m *Manifests, nodes *appsv1.Deployment) *Config {
	t.Helper()
	c := nodes.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Args, "-c")
	if i < 0 || i+1 == len(c.Args) {
		t.Fatalf("the node's args %q have no -c FILE", c.Args)
	}
	path := c.Args[i+1]
	var volume string
	for _, vm := range c.VolumeMounts {
		if filepath.Join(vm.MountPath, filepath.Base(path)) == path {
			volume = vm.Name
		}
	}
	var configMap string
	for _, v := range nodes.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.ConfigMap != nil {
			configMap = v.ConfigMap.Name
		}
	}
	for _, cm := range m.ConfigMaps {
		if cm.Name == configMap && filepath.Base(path) == configKey {
			text, ok := cm.Data[configKey]
			if !ok {
				t.Fatalf("ConfigMap %q has no %s", cm.Name, configKey)
			}
			config, err := ParseConfig(text)
			if err != nil {
				t.Fatalf("ConfigMap %q, %s: %v", cm.Name, configKey, err)
			}
			return config
		}
	}
	t.Fatalf("no ConfigMap holds %s, mounted where -c %s points", configKey, path)
	return nil
}

// containerPort is the number a Service's targetPort or a probe's port names in c.
func containerPort(t *testing.T, c corev1.Container, port intstr.IntOrString) int {
	t.Helper()
	if port.Type == intstr.Int {
		return port.IntValue()
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("container %q has no port named %q", c.Name, port.StrVal)
	return 0
}

func listenPort(t *testing.T, listen string) int {
	t.Helper()
	port, err := Port(listen)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func TestEveryManifestIsListedAndDecodesStrictly(t *testing.T) {
	d := load(t)
	files, err := yamlFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	listed := slices.Sorted(slices.Values(d.m.Kustomization.Resources))
	if !slices.Equal(files, listed) {
		t.Errorf("kustomization.yaml lists %q; the directory has %q", listed, files)
	}
	if k := d.m.Kustomization; k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	if len(d.m.Namespaces) != 1 || d.m.Namespaces[0].Name != d.m.Kustomization.Namespace {
		t.Errorf("want one Namespace, the kustomization's %q", d.m.Kustomization.Namespace)
	}
}

// The checker itself: a misspelt field is an error, not silently dropped.
func TestAnUnknownFieldIsAnError(t *testing.T) {
	var m Manifests
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 3\n"
	if err := m.add([]byte(doc)); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("spec.replica decoded: %v", err)
	}
	doc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  clusterIP: None\n  clusterIP: 10.0.0.1\n"
	if err := m.add([]byte(doc)); err == nil {
		t.Error("a duplicate field decoded")
	}
	doc = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: x\nspec:\n  maxUnavailabe: 1\n"
	if err := m.add([]byte(doc)); err == nil || !strings.Contains(err.Error(), "maxUnavailabe") {
		t.Errorf("spec.maxUnavailabe decoded: %v", err)
	}
	if err := m.add([]byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n")); err == nil {
		t.Error("a kind the check does not know decoded")
	}
}

func TestThreeNodesRunTheConfigMapsConfig(t *testing.T) {
	d := load(t)
	if r := d.nodes.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("replicas %v, want 3", r)
	}
	if len(d.node.Command) == 0 || !slices.Contains(d.node.Args, "run") {
		t.Errorf("the node runs %q %q, want `sluice run -c ...`", d.node.Command, d.node.Args)
	}
	selector := labels.SelectorFromSet(d.nodes.Spec.Selector.MatchLabels)
	if !selector.Matches(labels.Set(d.nodes.Spec.Template.Labels)) {
		t.Error("the Deployment's selector does not match its pods")
	}
	// Every env: secret the configuration reads is in the container's environment, from a
	// key of a Secret these manifests hold.
	for _, name := range d.config.EnvSecrets() {
		i := slices.IndexFunc(d.node.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 {
			t.Errorf("the configuration reads env:%s; the container does not set it", name)
			continue
		}
		ref := d.node.Env[i].ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || !d.m.SecretHas(ref.SecretKeyRef.Name, ref.SecretKeyRef.Key) {
			t.Errorf("env %s is not a key of a Secret here", name)
		}
	}
	if d.config.Admin.Listen != "0.0.0.0:9901" || d.config.Admin.Token == "" {
		t.Errorf("[admin] listen %q token %q, want 0.0.0.0:9901 with a token", d.config.Admin.Listen, d.config.Admin.Token)
	}
}

// SDKs resolve the headless Service to every node: it must have no cluster IP, select the
// node pods, publish the ones not ready yet too (a node is ready for clients only once the
// services that find it here have dialed in), and its port must be the acceptor's.
func TestTheAcceptorServiceIsHeadlessOverTheNodes(t *testing.T) {
	d := load(t)
	s := d.headless.Spec
	if s.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("clusterIP %q, want None: DNS must answer every node", s.ClusterIP)
	}
	if !s.PublishNotReadyAddresses {
		t.Error("publishNotReadyAddresses false: a starting node waits for sessions to be ready, and services would never find it")
	}
	if len(s.Selector) == 0 || !labels.SelectorFromSet(s.Selector).Matches(labels.Set(d.nodes.Spec.Template.Labels)) {
		t.Errorf("selector %v does not select the node pods %v", s.Selector, d.nodes.Spec.Template.Labels)
	}
	want := listenPort(t, d.config.Acceptor.Listen)
	if len(s.Ports) != 1 || int(s.Ports[0].Port) != want || containerPort(t, d.node, s.Ports[0].TargetPort) != want {
		t.Errorf("ports %+v, want %d to the acceptor's %d", s.Ports, want, want)
	}
	for _, other := range d.m.Services {
		if other.Name != headlessName && other.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("Service %q is headless too", other.Name)
		}
	}
}

func TestClientsReachTheListener(t *testing.T) {
	d := load(t)
	s := d.clients.Spec
	if !labels.SelectorFromSet(s.Selector).Matches(labels.Set(d.nodes.Spec.Template.Labels)) {
		t.Errorf("selector %v does not select the node pods", s.Selector)
	}
	var listeners []int
	for _, l := range d.config.Listeners {
		listeners = append(listeners, listenPort(t, l.Listen))
	}
	for _, p := range s.Ports {
		if got := containerPort(t, d.node, p.TargetPort); !slices.Contains(listeners, got) {
			t.Errorf("port %s goes to %d, not a [[listener]] (%v)", p.Name, got, listeners)
		}
	}
	if len(s.Ports) == 0 {
		t.Error("no port")
	}
}

// Readiness is /ready on the admin port (503 while starting or draining, no token needed),
// liveness /healthz; the preStop drains; the grace period outlasts shutdown_grace.
func TestProbesDrainAndGrace(t *testing.T) {
	d := load(t)
	admin := listenPort(t, d.config.Admin.Listen)
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readiness", d.node.ReadinessProbe, "/ready"}, {"liveness", d.node.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || containerPort(t, d.node, p.probe.HTTPGet.Port) != admin {
			t.Errorf("%s probe %s on %d, want %s on the admin port %d", p.what, p.probe.HTTPGet.Path,
				containerPort(t, d.node, p.probe.HTTPGet.Port), p.path, admin)
		}
	}
	pre := d.node.Lifecycle
	if pre == nil || pre.PreStop == nil || pre.PreStop.Exec == nil || len(pre.PreStop.Exec.Command) < 2 {
		t.Fatal("no preStop exec that drains the node")
	}
	if cmd := pre.PreStop.Exec.Command; cmd[0] != d.node.Command[0] || !slices.Contains(cmd, "ctl") {
		t.Errorf("preStop %q: want the node's own binary's ctl", cmd)
	}
	grace, err := d.config.ShutdownGrace()
	if err != nil {
		t.Fatal(err)
	}
	g := d.nodes.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil || time.Duration(*g)*time.Second <= grace {
		t.Errorf("terminationGracePeriodSeconds %s, want above shutdown_grace %v", fmtSeconds(g), grace)
	}
}

// A drain or a cluster upgrade evicts the nodes one at a time, never all of them: exactly one
// PodDisruptionBudget covers the node pods (and no other pods), lets at least one go (else a
// drain would hang) and keeps at least one; a node that is not ready may go regardless, so
// one stuck node does not block a drain.
func TestADisruptionBudgetEvictsOneNodeAtATime(t *testing.T) {
	d := load(t)
	nodePods := labels.Set(d.nodes.Spec.Template.Labels)
	var budget *policyv1.PodDisruptionBudget
	for i, b := range d.m.Budgets {
		selector, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || b.Spec.Selector == nil || selector.Empty() {
			t.Errorf("PodDisruptionBudget %q: selector %v (%v)", b.Name, b.Spec.Selector, err)
			continue
		}
		for _, other := range d.m.Deployments {
			if other.Name != nodesName && selector.Matches(labels.Set(other.Spec.Template.Labels)) {
				t.Errorf("PodDisruptionBudget %q selects the pods of Deployment %q too", b.Name, other.Name)
			}
		}
		if selector.Matches(nodePods) {
			if budget != nil {
				t.Errorf("PodDisruptionBudgets %q and %q both select the node pods: evictions fail", budget.Name, b.Name)
			}
			budget = &d.m.Budgets[i]
		}
	}
	if budget == nil {
		t.Fatalf("no PodDisruptionBudget selects the node pods %v", nodePods)
	}
	replicas := 1 // the Deployment's default
	if r := d.nodes.Spec.Replicas; r != nil {
		replicas = int(*r)
	}
	spec := budget.Spec
	var evictable int
	switch {
	case spec.MaxUnavailable != nil && spec.MinAvailable == nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(spec.MaxUnavailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		evictable = n
	case spec.MinAvailable != nil && spec.MaxUnavailable == nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(spec.MinAvailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		evictable = replicas - n
	default:
		t.Fatalf("PodDisruptionBudget %q: want one of minAvailable and maxUnavailable", budget.Name)
	}
	if evictable < 1 || evictable >= replicas {
		t.Errorf("PodDisruptionBudget %q lets %d of %d nodes go at once, want 1 to %d", budget.Name, evictable, replicas, replicas-1)
	}
	policy := policyv1.UnhealthyPodEvictionPolicyType("unset (IfHealthyBudget)")
	if spec.UnhealthyPodEvictionPolicy != nil {
		policy = *spec.UnhealthyPodEvictionPolicy
	}
	if policy != policyv1.AlwaysAllow {
		t.Errorf("PodDisruptionBudget %q: unhealthyPodEvictionPolicy %s, want AlwaysAllow", budget.Name, policy)
	}
}

// Both Deployments run as non-root on a read-only root, with no capabilities and no way to
// gain privileges, and ask for resources.
func TestPodsAreLockedDownAndSized(t *testing.T) {
	d := load(t)
	for _, dep := range []*appsv1.Deployment{d.nodes, d.example} {
		pod := dep.Spec.Template.Spec
		for _, c := range pod.Containers {
			where := fmt.Sprintf("%s/%s", dep.Name, c.Name)
			sc := c.SecurityContext
			nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
				(pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot)
			switch {
			case !nonRoot:
				t.Errorf("%s: runAsNonRoot is not set", where)
			case sc == nil:
				t.Errorf("%s: no securityContext", where)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: the root filesystem is writable", where)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
				t.Errorf("%s: capabilities are not all dropped", where)
			}
			r := c.Resources
			if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
				t.Errorf("%s: resources %+v, want CPU and memory requests and a memory limit", where, r)
			}
		}
	}
}

// The example service dials dns: of the headless Service, by its cluster DNS name and port,
// with the token and service of a reverse cluster the nodes serve.
func TestTheExampleServiceDialsEveryNodeThroughTheHeadlessService(t *testing.T) {
	d := load(t)
	c := d.example.Spec.Template.Spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	ns := d.m.Kustomization.Namespace
	if ns == "" {
		ns = "default"
	}
	want := fmt.Sprintf("dns:%s.%s.svc.cluster.local:%d", d.headless.Name, ns, d.headless.Spec.Ports[0].Port)
	if got := env["SLUICE_ACCEPTOR"].Value; got != want {
		t.Errorf("SLUICE_ACCEPTOR %q, want %q", got, want)
	}
	service := env["SLUICE_SERVICE"].Value
	cluster, ok := d.config.Clusters[service]
	if !ok || cluster.Kind != "reverse" {
		t.Fatalf("SLUICE_SERVICE %q is not a reverse cluster of the nodes' configuration", service)
	}
	token := env["SLUICE_TOKEN"].ValueFrom
	if token == nil || token.SecretKeyRef == nil {
		t.Fatal("SLUICE_TOKEN does not come from a Secret")
	}
	// The same Secret key one of the cluster's env: tokens reads on the nodes.
	opens := false
	for _, tok := range cluster.Tokens {
		for _, e := range d.node.Env {
			if "env:"+e.Name == tok && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
				*e.ValueFrom.SecretKeyRef == *token.SecretKeyRef {
				opens = true
			}
		}
	}
	if !opens {
		t.Errorf("SLUICE_TOKEN (%s/%s) is not a token of cluster %q", token.SecretKeyRef.Name, token.SecretKeyRef.Key, service)
	}
	if env["SLUICE_INSTANCE"].ValueFrom == nil || env["SLUICE_INSTANCE"].ValueFrom.FieldRef == nil {
		t.Error("SLUICE_INSTANCE is not the pod's name: every pod would share one instance id")
	}
}

// The ConfigMap's configuration loads in the real `sluice check`, when the binary has been
// built (the repository's test command builds it first).
func TestTheConfigLoadsInSluiceCheck(t *testing.T) {
	bin := sluiceBinary()
	if bin == "" {
		t.Skip("no sluice binary: cargo build -p sluice-cli --bin sluice (or set SLUICE_BIN)")
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), configKey)
	if err := os.WriteFile(path, []byte(m.ConfigMaps[0].Data[configKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-c", path)
	cmd.Env = os.Environ()
	config, _ := ParseConfig(m.ConfigMaps[0].Data[configKey])
	for _, name := range config.EnvSecrets() {
		cmd.Env = append(cmd.Env, name+"=check-only")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sluice check: %v\n%s", err, out)
	}
}

func sluiceBinary() string {
	if bin := os.Getenv("SLUICE_BIN"); bin != "" {
		return bin
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = filepath.Join(dir, "..", "..", "target")
	}
	bin := filepath.Join(target, "debug", "sluice")
	if _, err := os.Stat(bin); err != nil {
		return ""
	}
	return bin
}

func fmtSeconds(s *int64) string {
	if s == nil {
		return "unset (30 s)"
	}
	return fmt.Sprintf("%d s", *s)
}
