package main

// Values as helm builds them: YAML read through JSON (so numbers become float64, as with sigs.k8s.io/yaml),
// -f files merged in order, then --set / --set-string (helm's strvals syntax), then coalesced over the
// chart's values.yaml (a user `null` deletes a default).

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v2"
)

// yamlToJSONable turns yaml.v2's map[interface{}]interface{} trees into JSON-compatible ones.
func yamlToJSONable(v interface{}) (interface{}, error) {
	switch t := v.(type) {
	case map[interface{}]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, val := range t {
			var key string
			switch kk := k.(type) {
			case string:
				key = kk
			case int:
				key = strconv.Itoa(kk)
			case int64:
				key = strconv.FormatInt(kk, 10)
			case float64:
				key = strconv.FormatFloat(kk, 'g', -1, 64)
			case bool:
				key = strconv.FormatBool(kk)
			case nil:
				key = "null"
			default:
				return nil, fmt.Errorf("unsupported map key of type %T: %v", k, k)
			}
			conv, err := yamlToJSONable(val)
			if err != nil {
				return nil, err
			}
			out[key] = conv
		}
		return out, nil
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, val := range t {
			conv, err := yamlToJSONable(val)
			if err != nil {
				return nil, err
			}
			out[i] = conv
		}
		return out, nil
	}
	return v, nil
}

// yamlUnmarshal is sigs.k8s.io/yaml.Unmarshal: YAML -> JSON -> encoding/json into `out`.
func yamlUnmarshal(data []byte, out interface{}) error {
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("error converting YAML to JSON: %s", err)
	}
	conv, err := yamlToJSONable(raw)
	if err != nil {
		return err
	}
	j, err := json.Marshal(conv)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, out)
}

func readValues(data []byte) (map[string]interface{}, error) {
	vals := map[string]interface{}{}
	if err := yamlUnmarshal(data, &vals); err != nil {
		return nil, err
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	return vals, nil
}

func userValues(files, sets, setStrings []string) (map[string]interface{}, error) {
	base := map[string]interface{}{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cur, err := readValues(data)
		if err != nil {
			return nil, fmt.Errorf("failed to parse %s: %s", f, err)
		}
		base = mergeMaps(base, cur)
	}
	for _, s := range sets {
		if err := parseSet(s, base, false); err != nil {
			return nil, fmt.Errorf("failed parsing --set data: %s", err)
		}
	}
	for _, s := range setStrings {
		if err := parseSet(s, base, true); err != nil {
			return nil, fmt.Errorf("failed parsing --set-string data: %s", err)
		}
	}
	return base, nil
}

func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(bv, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesceValues overlays user values on the chart defaults (helm's chartutil.CoalesceValues).
func coalesceValues(defaults, user map[string]interface{}) map[string]interface{} {
	v := deepCopy(user).(map[string]interface{})
	coalesceTables(v, deepCopy(defaults).(map[string]interface{}))
	return v
}

func coalesceTables(dst, src map[string]interface{}) {
	for key, val := range src {
		dv, ok := dst[key]
		switch {
		case ok && dv == nil:
			delete(dst, key)
		case !ok:
			dst[key] = val
		default:
			dm, dIsMap := dv.(map[string]interface{})
			sm, sIsMap := val.(map[string]interface{})
			if dIsMap && sIsMap {
				coalesceTables(dm, sm)
			} else if dIsMap != sIsMap && val != nil {
				fmt.Fprintf(os.Stderr, "coalesce.go: warning: cannot overwrite table with non table for %s (%v)\n",
					key, val)
			}
		}
	}
}

func deepCopy(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, val := range t {
			out[k] = deepCopy(val)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, val := range t {
			out[i] = deepCopy(val)
		}
		return out
	}
	return v
}

// typedVal is strvals.typedVal: true/false/null, and integers without a leading zero, become typed.
func typedVal(val string, asString bool) interface{} {
	if asString {
		return val
	}
	switch {
	case strings.EqualFold(val, "true"):
		return true
	case strings.EqualFold(val, "false"):
		return false
	case strings.EqualFold(val, "null"):
		return nil
	case val == "0":
		return int64(0)
	}
	if val != "" && val[0] != '0' {
		if iv, err := strconv.ParseInt(val, 10, 64); err == nil {
			return iv
		}
	}
	return val
}

// splitUnescaped splits on sep outside braces, keeping backslash escapes for the next stage.
func splitUnescaped(s string, sep byte) []string {
	var parts []string
	var cur strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			cur.WriteByte(c)
			cur.WriteByte(s[i+1])
			i++
			continue
		case c == '{':
			depth++
		case c == '}' && depth > 0:
			depth--
		case c == sep && depth == 0:
			parts = append(parts, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(parts, cur.String())
}

func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

type pathStep struct {
	key   string
	index int // -1: a map key
}

func parseKey(key string) ([]pathStep, error) {
	var steps []pathStep
	for _, seg := range splitUnescaped(key, '.') {
		name := seg
		var idx []int
		for strings.HasSuffix(name, "]") {
			open := strings.LastIndex(name, "[")
			if open < 0 {
				return nil, fmt.Errorf("key %q has an unmatched ]", key)
			}
			n, err := strconv.Atoi(name[open+1 : len(name)-1])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("key %q has an invalid index", key)
			}
			idx = append([]int{n}, idx...)
			name = name[:open]
		}
		if name == "" && len(steps) == 0 {
			return nil, fmt.Errorf("key %q has no name", key)
		}
		if name != "" {
			steps = append(steps, pathStep{unescape(name), -1})
		}
		for _, n := range idx {
			steps = append(steps, pathStep{"", n})
		}
	}
	return steps, nil
}

func parseSet(s string, dest map[string]interface{}, asString bool) error {
	for _, entry := range splitUnescaped(s, ',') {
		if entry == "" {
			continue
		}
		eq := -1
		for i := 0; i < len(entry); i++ {
			if entry[i] == '\\' {
				i++
			} else if entry[i] == '=' {
				eq = i
				break
			}
		}
		if eq < 0 {
			return fmt.Errorf("key %q has no value", unescape(entry))
		}
		steps, err := parseKey(entry[:eq])
		if err != nil {
			return err
		}
		raw := entry[eq+1:]
		var val interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			list := []interface{}{}
			for _, item := range splitUnescaped(raw[1:len(raw)-1], ',') {
				if item != "" {
					list = append(list, typedVal(unescape(item), asString))
				}
			}
			val = list
		} else {
			val = typedVal(unescape(raw), asString)
		}
		setPath(dest, steps, val)
	}
	return nil
}

func setPath(root map[string]interface{}, steps []pathStep, val interface{}) {
	var container interface{} = root
	var assign func(interface{})
	for i, st := range steps {
		last := i == len(steps)-1
		var next interface{}
		if st.index < 0 {
			m, ok := container.(map[string]interface{})
			if !ok {
				m = map[string]interface{}{}
				assign(m)
			}
			if last {
				m[st.key] = val
				return
			}
			next = m[st.key]
			key := st.key
			assign = func(v interface{}) { m[key] = v }
		} else {
			l, _ := container.([]interface{})
			for len(l) <= st.index {
				l = append(l, nil)
			}
			assign(l)
			if last {
				l[st.index] = val
				return
			}
			next = l[st.index]
			idx := st.index
			assign = func(v interface{}) { l[idx] = v }
		}
		container = next
	}
}
