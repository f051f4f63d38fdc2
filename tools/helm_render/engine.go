package main

// The template engine: helm's engine.go behaviour on text/template + Sprig. Every template (partials
// too) is parsed into one set, in helm's order; files whose name starts with "_" are not rendered on their
// own; missing keys render as empty; errors are reported as helm words them.

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v2"
)

const recursionMaxNums = 1000

var warnRegex = regexp.MustCompile(`HELM_ERR_START((?s:.*))HELM_ERR_END`)

func warnWrap(warn string) string { return "HELM_ERR_START" + warn + "HELM_ERR_END" }

type engine struct {
	chart *Chart
}

func newEngine(c *Chart) *engine { return &engine{chart: c} }

// toYAML is helm's toYaml: JSON encoding first (sigs.k8s.io/yaml), then YAML; "" on error.
func toYAML(v interface{}) string {
	j, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var obj interface{}
	if err := yaml.Unmarshal(j, &obj); err != nil {
		return ""
	}
	data, err := yaml.Marshal(obj)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yamlUnmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yamlUnmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func includeFun(t *template.Template, included map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		if included[name] > recursionMaxNums {
			return "", fmt.Errorf("rendering template has a nested reference name: %s: unable to execute template",
				name)
		}
		included[name]++
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		included[name]--
		return buf.String(), err
	}
}

func tplFun(parent *template.Template, included map[string]int) func(string, interface{}) (string, error) {
	return func(tpl string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %w", err)
		}
		t.Option("missingkey=zero")
		t.Funcs(template.FuncMap{"include": includeFun(t, included), "tpl": tplFun(t, included)})
		t, err = t.New(parent.Name()).Parse(tpl)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", tpl, err)
		}
		var buf strings.Builder
		if err := t.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

func (e *engine) funcMap(t *template.Template, included map[string]int) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	extra := template.FuncMap{
		"toYaml": toYAML, "fromYaml": fromYAML, "fromYamlArray": fromYAMLArray,
		"toJson": toJSON, "fromJson": fromJSON, "fromJsonArray": fromJSONArray,
		"include": includeFun(t, included),
		"tpl":     tplFun(t, included),
		"required": func(warn string, val interface{}) (interface{}, error) {
			if val == nil {
				return val, errors.New(warnWrap(warn))
			}
			if s, ok := val.(string); ok && s == "" {
				return val, errors.New(warnWrap(warn))
			}
			return val, nil
		},
		"fail": func(msg string) (string, error) { return "", errors.New(warnWrap(msg)) },
		// helm template has no cluster: lookup finds nothing.
		"lookup": func(string, string, string, string) (map[string]interface{}, error) {
			return map[string]interface{}{}, nil
		},
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

// sortedTemplateNames is helm's sortTemplates: deeper paths first, then by name (later parses win `define`s).
func sortedTemplateNames(tpls map[string]string) []string {
	keys := make([]string, 0, len(tpls))
	for k := range tpls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		ci, cj := strings.Count(keys[i], "/"), strings.Count(keys[j], "/")
		if ci != cj {
			return ci > cj
		}
		return keys[i] > keys[j]
	})
	return keys
}

func (e *engine) render(top map[string]interface{}) (map[string]string, error) {
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	included := map[string]int{}
	t.Funcs(e.funcMap(t, included))
	keys := sortedTemplateNames(e.chart.Templates)
	for _, name := range keys {
		if _, err := t.New(name).Parse(e.chart.Templates[name]); err != nil {
			return nil, cleanupParseError(name, err)
		}
	}
	rendered := map[string]string{}
	for _, name := range keys {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		vals := map[string]interface{}{}
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": e.chart.Metadata.Name + "/templates"}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, reformatExecErrorMsg(name, err)
		}
		rendered[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return rendered, nil
}

func cleanupParseError(filename string, err error) error {
	tokens := strings.Split(err.Error(), ": ")
	if len(tokens) == 1 {
		return fmt.Errorf("parse error in (%s): %s", filename, err)
	}
	return fmt.Errorf("parse error at (%s): %s", tokens[1], tokens[len(tokens)-1])
}

func reformatExecErrorMsg(filename string, err error) error {
	tokens := strings.SplitN(err.Error(), ": ", 3)
	if len(tokens) != 3 {
		return fmt.Errorf("%s: %s", filename, err)
	}
	if parts := warnRegex.FindStringSubmatch(tokens[2]); len(parts) >= 2 {
		return fmt.Errorf("execution error at (%s): %s", tokens[1], parts[1])
	}
	return err
}
