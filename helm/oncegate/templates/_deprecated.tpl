{{/*
Chart values renamed within the major version: each keeps working, with a
warning in NOTES.txt naming its successor (the compatibility policy,
docs/UPGRADING.md). One line per rename below, `old.path: new.path`; the old
name stays in values.schema.json ("deprecated": true, its description naming
the successor) and in the README's table of values. A value given under its
old name is used for the new one: the old name is in no values.yaml default,
so it is set only when a user set it.

oncegate.honourRenamedValues copies each before anything reads the values:
every template starts with it, and oncegate.validate (which the sidecar
include runs, in a parent chart too) runs it; it is idempotent.
*/}}
{{- define "oncegate.renamedValues" -}}
{{- end -}}

{{/* "true" when the dotted path (list .Values "a.b.c") holds a value. */}}
{{- define "oncegate.valueIsSet" -}}
{{- $at := index . 0 -}}
{{- $set := true -}}
{{- range $key := splitList "." (index . 1) -}}
{{- if and $set (kindIs "map" $at) (hasKey $at $key) -}}
{{- $at = index $at $key -}}
{{- else -}}
{{- $set = false -}}
{{- end -}}
{{- end -}}
{{- if and $set (not (kindIs "invalid" $at)) }}true{{ end -}}
{{- end -}}

{{- define "oncegate.honourRenamedValues" -}}
{{- $values := .Values -}}
{{- range $old, $new := include "oncegate.renamedValues" . | fromYaml -}}
{{- if include "oncegate.valueIsSet" (list $values $old) -}}
{{- $value := $values -}}
{{- range $key := splitList "." $old -}}
{{- $value = index $value $key -}}
{{- end -}}
{{- $parent := $values -}}
{{- $keys := splitList "." $new -}}
{{- range $key := initial $keys -}}
{{- if not (kindIs "map" (index $parent $key)) -}}
{{- $_ := set $parent $key dict -}}
{{- end -}}
{{- $parent = index $parent $key -}}
{{- end -}}
{{- $_ := set $parent (last $keys) $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* NOTES.txt's warning for each renamed value given under its old name. */}}
{{- define "oncegate.renamedValuesNotes" -}}
{{- $values := .Values -}}
{{- range $old, $new := include "oncegate.renamedValues" . | fromYaml -}}
{{- if include "oncegate.valueIsSet" (list $values $old) }}

WARNING: the value {{ $old }} is deprecated: it was used as {{ $new }}, its
successor. Set {{ $new }} instead; {{ $old }} keeps working until the next
major version.
{{- end -}}
{{- end -}}
{{- end -}}
