package main

// Turning rendered files into `helm template` output: NOTES.txt set apart, each file split at `---`,
// empty documents dropped, each manifest parsed as YAML (helm fails the release on a parse error), and
// manifests ordered by helm's install order of kinds.

import (
	"fmt"
	"io"
	"path"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v2"
)

var sepRegexp = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// installOrder is helm's releaseutil.InstallOrder.
var installOrder = []string{"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap",
	"StorageClass", "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
	"ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding",
	"RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
	"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}

type manifest struct {
	source, content, kind string
}

type simpleHead struct {
	Version  string `yaml:"apiVersion"`
	Kind     string `yaml:"kind"`
	Metadata *struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
}

func sortManifests(chartName string, rendered map[string]string) ([]manifest, string, error) {
	names := make([]string, 0, len(rendered))
	for n := range rendered {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []manifest
	notes := ""
	for _, name := range names {
		content := rendered[name]
		if path.Base(name) == "NOTES.txt" {
			if name == chartName+"/templates/NOTES.txt" {
				notes = content
			}
			continue
		}
		for _, doc := range sepRegexp.Split(content, -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var head simpleHead
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, "", fmt.Errorf("YAML parse error on %s: %s", name, err)
			}
			if head.Kind == "" {
				return nil, "", fmt.Errorf("manifest in %s has no kind", name)
			}
			out = append(out, manifest{name, strings.TrimSpace(doc), head.Kind})
		}
	}
	rank := func(kind string) int {
		for i, k := range installOrder {
			if k == kind {
				return i
			}
		}
		return len(installOrder)
	}
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i].kind) < rank(out[j].kind) })
	return out, notes, nil
}

func writeManifests(w io.Writer, manifests []manifest, notes string, o *options) error {
	shown := map[string]bool{}
	for _, m := range manifests {
		if len(o.showOnly) > 0 && !matchesShowOnly(m.source, o.showOnly) {
			continue
		}
		shown[m.source] = true
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", m.source, m.content)
	}
	for _, s := range o.showOnly {
		found := false
		for src := range shown {
			found = found || matchesShowOnly(src, []string{s})
		}
		if !found {
			return fmt.Errorf("could not find template %s in chart", s)
		}
	}
	if o.notes && notes != "" {
		fmt.Fprintf(w, "\nNOTES:\n%s\n", notes)
	}
	return nil
}

func matchesShowOnly(source string, patterns []string) bool {
	rel := source[strings.Index(source, "/")+1:]
	for _, p := range patterns {
		if ok, _ := path.Match(p, rel); ok || p == source {
			return true
		}
	}
	return false
}
