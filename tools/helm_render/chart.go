package main

// Loading a chart directory the way helm's loader does: Chart.yaml into .Chart, values.yaml as the
// defaults, templates/ as templates, every other file (minus .helmignore matches) into .Files.

import (
	"encoding/base64"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/Masterminds/semver"
	"gopkg.in/yaml.v2"
)

// defaultKubeVersion stands in for the client-go version helm was built with.
const defaultKubeVersion = "1.33.0"

// Maintainer and Metadata mirror helm's chart.Maintainer and chart.Metadata: templates see these fields.
type Maintainer struct {
	Name  string `yaml:"name"`
	Email string `yaml:"email"`
	URL   string `yaml:"url"`
}

type Metadata struct {
	Name         string            `yaml:"name"`
	Home         string            `yaml:"home"`
	Sources      []string          `yaml:"sources"`
	Version      string            `yaml:"version"`
	Description  string            `yaml:"description"`
	Keywords     []string          `yaml:"keywords"`
	Maintainers  []*Maintainer     `yaml:"maintainers"`
	Icon         string            `yaml:"icon"`
	APIVersion   string            `yaml:"apiVersion"`
	Condition    string            `yaml:"condition"`
	Tags         string            `yaml:"tags"`
	AppVersion   string            `yaml:"appVersion"`
	Deprecated   bool              `yaml:"deprecated"`
	Annotations  map[string]string `yaml:"annotations"`
	KubeVersion  string            `yaml:"kubeVersion"`
	Type         string            `yaml:"type"`
	Dependencies []interface{}     `yaml:"dependencies"`
}

type Chart struct {
	Metadata  *Metadata
	Values    map[string]interface{}
	Templates map[string]string // "<chart name>/templates/x.yaml" -> text
	Files     Files
}

func loadChart(dir string) (*Chart, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("%s is not a chart: %w", dir, err)
	}
	md := &Metadata{}
	if err := yaml.UnmarshalStrict(raw, md); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %w", err)
	}
	if md.APIVersion != "v2" {
		return nil, fmt.Errorf("validation: chart.metadata.apiVersion must be v2 here, got %q", md.APIVersion)
	}
	if md.Name == "" {
		return nil, fmt.Errorf("validation: chart.metadata.name is required")
	}
	if _, err := semver.StrictNewVersion(md.Version); err != nil {
		return nil, fmt.Errorf("validation: chart.metadata.version %q is invalid", md.Version)
	}
	if len(md.Dependencies) > 0 {
		return nil, fmt.Errorf("chart dependencies are not supported by helm-render")
	}
	c := &Chart{Metadata: md, Values: map[string]interface{}{}, Templates: map[string]string{}, Files: Files{}}
	ignore, err := loadHelmignore(dir)
	if err != nil {
		return nil, err
	}
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if ignore.ignored(rel, info.IsDir()) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if info.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case rel == "Chart.yaml", rel == "Chart.lock", rel == "values.schema.json":
		case rel == "values.yaml":
			if c.Values, err = readValues(data); err != nil {
				return fmt.Errorf("cannot load values.yaml: %w", err)
			}
		case strings.HasPrefix(rel, "templates/"):
			c.Templates[md.Name+"/"+rel] = string(data)
		case strings.HasPrefix(rel, "charts/"):
			return fmt.Errorf("subcharts (%s) are not supported by helm-render", rel)
		default:
			c.Files[rel] = data
		}
		return nil
	})
	return c, err
}

// helmignore holds .helmignore rules: gitignore-like globs, `dir/` for directories, `!` to re-include.
type ignoreRule struct {
	pattern       string
	negate, isDir bool
}

type helmignore []ignoreRule

func loadHelmignore(dir string) (helmignore, error) {
	data, err := os.ReadFile(filepath.Join(dir, ".helmignore"))
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var rules helmignore
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		line = strings.TrimPrefix(line, "!")
		isDir := strings.HasSuffix(line, "/")
		rules = append(rules, ignoreRule{strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/"), neg, isDir})
	}
	return rules, nil
}

func (h helmignore) ignored(rel string, isDir bool) bool {
	if rel == ".helmignore" {
		return true
	}
	out := false
	for _, r := range h {
		if r.isDir && !isDir {
			continue
		}
		target := path.Base(rel)
		if strings.Contains(r.pattern, "/") {
			target = rel
		}
		if ok, _ := path.Match(r.pattern, target); ok {
			out = !r.negate
		}
	}
	return out
}

// Files is helm's .Files: the chart's non-template files by path.
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f[name]) }

// Glob selects files like helm's (gobwas/glob with '/' as separator): `*` stays within a directory,
// `**` crosses them.
func (f Files) Glob(pattern string) Files {
	re, err := globRegexp(pattern)
	if err != nil {
		re = regexp.MustCompile(".*")
	}
	out := Files{}
	for name, data := range f {
		if re.MatchString(name) {
			out[name] = data
		}
	}
	return out
}

func (f Files) AsConfig() string {
	if f == nil {
		return ""
	}
	m := map[string]string{}
	for k, v := range f {
		m[path.Base(k)] = string(v)
	}
	return toYAML(m)
}

func (f Files) AsSecrets() string {
	if f == nil {
		return ""
	}
	m := map[string]string{}
	for k, v := range f {
		m[path.Base(k)] = base64.StdEncoding.EncodeToString(v)
	}
	return toYAML(m)
}

func (f Files) Lines(p string) []string {
	if f == nil || f[p] == nil {
		return []string{}
	}
	s := string(f[p])
	if s != "" && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	return strings.Split(s, "\n")
}

func globRegexp(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	inClass, inAlt := false, false
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case inClass:
			if c == ']' {
				inClass = false
			}
			if c == '!' && pattern[i-1] == '[' {
				c = '^'
			}
			b.WriteByte(c)
		case c == '*' && i+1 < len(pattern) && pattern[i+1] == '*':
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			inClass = true
			b.WriteByte(c)
		case c == '{':
			inAlt = true
			b.WriteString("(?:")
		case c == '}' && inAlt:
			inAlt = false
			b.WriteString(")")
		case c == ',' && inAlt:
			b.WriteString("|")
		case c == '\\' && i+1 < len(pattern):
			i++
			b.WriteString(regexp.QuoteMeta(string(pattern[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// KubeVersion, VersionSet and Capabilities mirror helm's chartutil types.
type KubeVersion struct {
	Version string // "v1.29.0"
	Major   string
	Minor   string
}

func (kv *KubeVersion) String() string     { return kv.Version }
func (kv *KubeVersion) GitVersion() string { return kv.Version }

type VersionSet []string

func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

type HelmVersion struct{ Version, GitCommit, GitTreeState, GoVersion string }

type Capabilities struct {
	KubeVersion *KubeVersion
	APIVersions VersionSet
	HelmVersion HelmVersion
}

// builtinAPIVersions are the group/versions of a plain cluster (helm adds those of its client-go scheme).
var builtinAPIVersions = []string{"v1", "apps/v1", "batch/v1", "autoscaling/v1", "autoscaling/v2", "policy/v1",
	"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1", "scheduling.k8s.io/v1",
	"coordination.k8s.io/v1", "discovery.k8s.io/v1", "apiextensions.k8s.io/v1", "admissionregistration.k8s.io/v1",
	"certificates.k8s.io/v1", "node.k8s.io/v1", "events.k8s.io/v1"}

func newCapabilities(kubeVersion string, extra []string) (*Capabilities, error) {
	v, err := semver.NewVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid kube version %q: %s", kubeVersion, err)
	}
	apis := append(append(VersionSet{}, builtinAPIVersions...), extra...)
	sort.Strings(apis)
	return &Capabilities{
		KubeVersion: &KubeVersion{Version: "v" + v.String(), Major: strconv.FormatUint(v.Major(), 10),
			Minor: strconv.FormatUint(v.Minor(), 10)},
		APIVersions: apis,
		HelmVersion: HelmVersion{Version: "v3.17.0-helm-render", GoVersion: "go1.19"},
	}, nil
}

func checkKubeVersion(constraint string, kv *KubeVersion) error {
	if constraint == "" {
		return nil
	}
	c, err := semver.NewConstraint(constraint)
	if err != nil {
		return fmt.Errorf("invalid kubeVersion constraint %q in Chart.yaml: %s", constraint, err)
	}
	v, err := semver.NewVersion(kv.Version)
	if err != nil {
		return err
	}
	if !c.Check(v) {
		return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", constraint,
			kv.Version)
	}
	return nil
}
