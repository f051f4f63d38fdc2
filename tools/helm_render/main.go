// Command helm-render renders a Helm chart the way `helm template` does, without helm.
//
// Helm cannot be installed where this project is built and tested, so the chart is rendered by the same
// engines helm uses: Go's text/template with Sprig's TxtFuncMap (minus env/expandenv, as helm removes them),
// plus helm's own functions (include, tpl, required, fail, toYaml, fromYaml, toJson, fromJson, lookup) and
// its objects (.Values, .Release, .Chart, .Capabilities, .Files, .Template). Values are merged and coalesced
// by helm's rules. What it does not do is listed in docs/deployment.md ("How the chart is tested").
//
// Build offline from Debian's packages (no module proxy):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o helm-render ./tools/helm_render
//
// Usage (a subset of `helm template`):
//
//	helm-render [NAME] CHART [-n NS] [-f values.yaml]... [--set k=v]... [--set-string k=v]...
//	            [--kube-version 1.29] [--api-versions group/version]... [--show-only templates/x.yaml]...
//	            [--dump-values] [--notes]
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

type options struct {
	name, chartDir, namespace, kubeVersion string
	valueFiles, sets, setStrings           []string
	apiVersions, showOnly                  []string
	dumpValues, notes                      bool
}

func parseArgs(args []string) (*options, error) {
	o := &options{name: "release-name", namespace: "default", kubeVersion: defaultKubeVersion}
	var positional []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, value, hasValue := strings.Cut(arg, "=")
		if !strings.HasPrefix(arg, "-") {
			positional = append(positional, arg)
			continue
		}
		takes := map[string]*[]string{"-f": &o.valueFiles, "--values": &o.valueFiles, "--set": &o.sets,
			"--set-string": &o.setStrings, "--api-versions": &o.apiVersions, "-a": &o.apiVersions,
			"--show-only": &o.showOnly, "-s": &o.showOnly}
		single := map[string]*string{"-n": &o.namespace, "--namespace": &o.namespace,
			"--kube-version": &o.kubeVersion, "--name-template": &o.name}
		switch {
		case name == "--dump-values":
			o.dumpValues = true
		case name == "--notes":
			o.notes = true
		case takes[name] != nil || single[name] != nil:
			if !hasValue {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("flag needs an argument: %s", name)
				}
				i++
				value = args[i]
			}
			if takes[name] != nil {
				*takes[name] = append(*takes[name], value)
			} else {
				*single[name] = value
			}
		default:
			return nil, fmt.Errorf("unknown flag: %s", name)
		}
	}
	switch len(positional) {
	case 1:
		o.chartDir = positional[0]
	case 2:
		o.name, o.chartDir = positional[0], positional[1]
	default:
		return nil, fmt.Errorf("usage: helm-render [NAME] CHART [flags]")
	}
	return o, nil
}

func run(o *options) error {
	chart, err := loadChart(o.chartDir)
	if err != nil {
		return err
	}
	user, err := userValues(o.valueFiles, o.sets, o.setStrings)
	if err != nil {
		return err
	}
	values := coalesceValues(chart.Values, user)
	if o.dumpValues {
		out, err := json.MarshalIndent(values, "", "  ")
		if err != nil {
			return err
		}
		fmt.Println(string(out))
		return nil
	}
	caps, err := newCapabilities(o.kubeVersion, o.apiVersions)
	if err != nil {
		return err
	}
	if err := checkKubeVersion(chart.Metadata.KubeVersion, caps.KubeVersion); err != nil {
		return err
	}
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{"Name": o.name, "Namespace": o.namespace, "IsUpgrade": false,
			"IsInstall": true, "Revision": 1, "Service": "Helm"},
		"Chart":        chart.Metadata,
		"Capabilities": caps,
		"Files":        chart.Files,
	}
	rendered, err := newEngine(chart).render(top)
	if err != nil {
		return err
	}
	manifests, notes, err := sortManifests(chart.Metadata.Name, rendered)
	if err != nil {
		return err
	}
	return writeManifests(os.Stdout, manifests, notes, o)
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s\n", err)
		os.Exit(1)
	}
}
