//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"kernelgate/internal/k8stest"
)

// TestDeployManifestsApply: every object of deploy/kubernetes (the
// three replicas, their PodDisruptionBudget and claim included) and of
// its example PostgreSQL is accepted by a real kube-apiserver, which
// validates them as kubectl apply would have it do.
func TestDeployManifestsApply(t *testing.T) {
	cp := k8stest.Start(t)
	const ns = "kernelgate"
	cp.CreateNamespace(t, ns)
	ctx := context.Background()
	c := cp.Client
	files, _ := filepath.Glob("deploy/kubernetes/*.yaml")
	files = append(files, "deploy/kubernetes/example-postgres/postgres.yaml")
	created := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "kustomization.yaml") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(b, []byte("\n---\n")) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatal(err)
			}
			create := func(obj any, do func() error) {
				if err := yaml.UnmarshalStrict(doc, obj); err != nil {
					t.Fatalf("%s %s: %v", f, meta.Kind, err)
				}
				if err := do(); err != nil {
					t.Errorf("%s %s: the API server refuses it: %v", f, meta.Kind, err)
					return
				}
				created[meta.Kind] = true
			}
			opts := metav1.CreateOptions{}
			switch meta.Kind {
			case "ServiceAccount":
				var o corev1.ServiceAccount
				create(&o, func() error { _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &o, opts); return err })
			case "Role":
				var o rbacv1.Role
				create(&o, func() error { _, err := c.RbacV1().Roles(ns).Create(ctx, &o, opts); return err })
			case "RoleBinding":
				var o rbacv1.RoleBinding
				create(&o, func() error { _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &o, opts); return err })
			case "ConfigMap":
				var o corev1.ConfigMap
				create(&o, func() error { _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &o, opts); return err })
			case "Secret":
				var o corev1.Secret
				create(&o, func() error { _, err := c.CoreV1().Secrets(ns).Create(ctx, &o, opts); return err })
			case "Service":
				var o corev1.Service
				create(&o, func() error { _, err := c.CoreV1().Services(ns).Create(ctx, &o, opts); return err })
			case "PersistentVolumeClaim":
				var o corev1.PersistentVolumeClaim
				create(&o, func() error {
					_, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &o, opts)
					return err
				})
			case "Deployment":
				var o appsv1.Deployment
				create(&o, func() error { _, err := c.AppsV1().Deployments(ns).Create(ctx, &o, opts); return err })
			case "StatefulSet":
				var o appsv1.StatefulSet
				create(&o, func() error { _, err := c.AppsV1().StatefulSets(ns).Create(ctx, &o, opts); return err })
			case "PodDisruptionBudget":
				var o policyv1.PodDisruptionBudget
				create(&o, func() error {
					_, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &o, opts)
					return err
				})
			case "NetworkPolicy":
				var o networkingv1.NetworkPolicy
				create(&o, func() error { _, err := c.NetworkingV1().NetworkPolicies(ns).Create(ctx, &o, opts); return err })
			default:
				t.Errorf("%s: kind %q not applied here", f, meta.Kind)
			}
		}
	}
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "PersistentVolumeClaim", "StatefulSet", "Role"} {
		if !created[k] {
			t.Errorf("no %s applied", k)
		}
	}
	dep, err := c.AppsV1().Deployments(ns).Get(ctx, "kernelgate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 {
		t.Errorf("the applied Deployment has %d replicas, want 3", *dep.Spec.Replicas)
	}
}
