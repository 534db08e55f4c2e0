"""What RBAC alone allows a tessera ServiceAccount (SubjectAccessReview)."""

from __future__ import annotations

from lightkube import Client
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SubjectAccessReview


def allowed(client: Client, account: str, verb: str, resource: str, namespace: str | None,
            group: str = "", name: str | None = None) -> bool:
    """SubjectAccessReview for ServiceAccount NS/account (what RBAC alone decides)."""
    res, _, sub = resource.partition("/")
    review = client.create(SubjectAccessReview(spec=SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{NS}:{account}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
        resourceAttributes=ResourceAttributes(verb=verb, group=group, resource=res,
                                              subresource=sub or None, namespace=namespace,
                                              name=name))))
    return bool(review.status and review.status.allowed)


NS = "tessera-system"
