// Package check verifies deploy/kubernetes offline, where no API server runs: every document
// decodes strictly into the k8s.io/api types (an unknown or duplicate field is an error, as
// `kubectl apply --validate=strict` would make it), and what the many-node design depends on
// holds (see manifests_test.go). Run it with `go test ./...` in this directory.
package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Kustomization is the part of kustomization.yaml this directory uses; anything else in it is
// an error, so that a generator or patch added later is checked here too.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

// Manifests are the decoded documents of a directory, by kind.
type Manifests struct {
	Kustomization Kustomization
	Namespaces    []corev1.Namespace
	Secrets       []corev1.Secret
	ConfigMaps    []corev1.ConfigMap
	Services      []corev1.Service
	Deployments   []appsv1.Deployment
	Budgets       []policyv1.PodDisruptionBudget // PodDisruptionBudgets
}

// Load reads dir's kustomization.yaml and decodes every resource it lists, strictly.
func Load(dir string) (*Manifests, error) {
	m := &Manifests{}
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(raw, &m.Kustomization); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	for _, name := range m.Kustomization.Resources {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		for i, doc := range documents(raw) {
			if err := m.add(doc); err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", name, i+1, err)
			}
		}
	}
	return m, nil
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// documents splits a YAML stream at its `---` lines, dropping empty documents.
func documents(raw []byte) [][]byte {
	var docs [][]byte
	for _, doc := range separator.Split(string(raw), -1) {
		if strings.TrimSpace(stripComments(doc)) != "" {
			docs = append(docs, []byte(doc))
		}
	}
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// add decodes one document into the type its apiVersion and kind name.
func (m *Manifests) add(doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	switch gvk := meta.APIVersion + " " + meta.Kind; gvk {
	case "v1 Namespace":
		return decodeInto(doc, &m.Namespaces)
	case "v1 Secret":
		return decodeInto(doc, &m.Secrets)
	case "v1 ConfigMap":
		return decodeInto(doc, &m.ConfigMaps)
	case "v1 Service":
		return decodeInto(doc, &m.Services)
	case "apps/v1 Deployment":
		return decodeInto(doc, &m.Deployments)
	case "policy/v1 PodDisruptionBudget":
		return decodeInto(doc, &m.Budgets)
	default:
		return fmt.Errorf("%q is not a kind this check knows; add it to Manifests", gvk)
	}
}

// decodeInto decodes doc strictly (unknown and duplicate fields are errors) and appends it.
func decodeInto[T any](doc []byte, into *[]T) error {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return err
	}
	*into = append(*into, v)
	return nil
}

// Deployment is the Deployment named name, or nil.
func (m *Manifests) Deployment(name string) *appsv1.Deployment {
	i := slices.IndexFunc(m.Deployments, func(d appsv1.Deployment) bool { return d.Name == name })
	if i < 0 {
		return nil
	}
	return &m.Deployments[i]
}

// Service is the Service named name, or nil.
func (m *Manifests) Service(name string) *corev1.Service {
	i := slices.IndexFunc(m.Services, func(s corev1.Service) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return &m.Services[i]
}

// SecretHas reports whether a Secret named name has key (in data or stringData).
func (m *Manifests) SecretHas(name, key string) bool {
	for _, s := range m.Secrets {
		if s.Name != name {
			continue
		}
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		return inData || inString
	}
	return false
}

// yamlFiles lists dir's *.yaml files but kustomization.yaml.
func yamlFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") && e.Name() != "kustomization.yaml" {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
