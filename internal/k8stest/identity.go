package k8stest

import (
	"context"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ServiceAccount creates the ServiceAccount namespace/name, the given Roles
// (in their own namespaces; ones that exist are left as they are) and a
// RoleBinding of each to it, and returns a config that authenticates as it
// with a token from the TokenRequest API. The identity may do exactly what
// the Roles grant: with none it may do nothing beyond what every
// authenticated user may. It returns once the apiserver knows the token
// and the bindings.
func (cp *ControlPlane) ServiceAccount(t testing.TB, namespace, name string, roles ...*rbacv1.Role) *rest.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rbac := cp.Client.RbacV1()
	_, err := cp.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create ServiceAccount %s/%s: %v", namespace, name, err)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	for _, role := range roles {
		r := role.DeepCopy()
		r.ResourceVersion = ""
		if _, err := rbac.Roles(r.Namespace).Create(ctx, r, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create Role %s/%s: %v", r.Namespace, r.Name, err)
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + r.Name, Namespace: r.Namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
		}
		if _, err := rbac.RoleBindings(r.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create RoleBinding %s/%s: %v", r.Namespace, binding.Name, err)
		}
	}
	expiry := int64(3600)
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("request a token for %s: %v", user, err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	cfg.QPS, cfg.Burst = cp.Config.QPS, cp.Config.Burst

	// The authenticator and the RBAC authorizer read through caches: wait
	// until the token authenticates and each Role's first rule is allowed.
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func() (bool, error) {
		_, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("token of %s never authenticated: %v", user, err)
	}
	for _, role := range roles {
		if len(role.Rules) == 0 || len(role.Rules[0].Verbs) == 0 || len(role.Rules[0].Resources) == 0 {
			continue
		}
		rule := role.Rules[0]
		attrs := &authorizationv1.ResourceAttributes{Namespace: role.Namespace, Verb: rule.Verbs[0], Resource: rule.Resources[0]}
		if len(rule.APIGroups) > 0 {
			attrs.Group = rule.APIGroups[0]
		}
		if err := poll(ctx, func() (bool, error) {
			r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: attrs},
			}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, nil
		}); err != nil {
			t.Fatalf("Role %s/%s never took effect for %s: %v", role.Namespace, role.Name, user, err)
		}
	}
	return cfg
}

// poll calls f every 50 ms until it reports done, fails, or ctx ends.
func poll(ctx context.Context, f func() (bool, error)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("gave up: %w", ctx.Err())
		}
	}
}
