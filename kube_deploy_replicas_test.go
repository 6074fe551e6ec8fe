package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The example PostgreSQL of deploy/kubernetes/example-postgres parses
// strictly, and makes the Secret the gateways read their store's URL
// from, pointing at its Service.
func TestDeployExamplePostgres(t *testing.T) {
	b, err := os.ReadFile("deploy/kubernetes/example-postgres/postgres.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		sts     appsv1.StatefulSet
		svc     corev1.Service
		secrets = map[string]corev1.Secret{}
	)
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "StatefulSet":
			err = yaml.UnmarshalStrict(doc, &sts)
		case "Service":
			err = yaml.UnmarshalStrict(doc, &svc)
		case "Secret":
			var s corev1.Secret
			err = yaml.UnmarshalStrict(doc, &s)
			secrets[s.Name] = s
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	dep, err := os.ReadFile("deploy/kubernetes/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(dep, &d); err != nil {
		t.Fatal(err)
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name != "KERNELGATE_STATE_URL" {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		url := secrets[ref.Name].StringData[ref.Key]
		if !strings.HasPrefix(url, "postgres://") || !strings.Contains(url, "@"+svc.Name+":") {
			t.Errorf("Secret %s key %s is %q, want a postgres:// URL of Service %s", ref.Name, ref.Key, url, svc.Name)
		}
		if !labelsMatch(svc.Spec.Selector, sts.Spec.Template.Labels) || sts.Spec.ServiceName != svc.Name {
			t.Errorf("the Service does not select the StatefulSet's pods")
		}
		return
	}
	t.Error("the Deployment reads no KERNELGATE_STATE_URL")
}
