"""The template: its resources on moto, and a resolver for the intrinsics that name them."""

from __future__ import annotations

import copy
import json
import re
import secrets
from typing import Any, Final, Protocol

from .settings import ACCOUNT, API_ID, REGION, ROOT, STACK_NAME, TENANT

# The version a stack's first deploy publishes of each function with an AutoPublishAlias.
PUBLISHED_VERSION = "1"


class Unresolvable(Exception):
    pass


_NO_VALUE: Final = object()  # what Ref AWS::NoValue resolves to, until its container drops it


def _is_intrinsic(key: str) -> bool:
    return key in ("Ref", "Condition") or key.startswith("Fn::")


class Clients(Protocol):
    def client(self, name: str) -> Any: ...


class MotoSession:
    """boto3 clients of ``session``, every one sent to the moto server at ``url``."""

    def __init__(self, session: Any, url: str) -> None:
        self._session, self._url = session, url

    def client(self, name: str) -> Any:
        return self._session.client(name, endpoint_url=self._url)


def _pseudo_parameters() -> dict[str, Any]:
    return {
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackName": STACK_NAME,
        "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK_NAME}"
        "/0a1b2c3d-0000-4000-8000-000000000000",
    }


class Stack:
    """The template's resources on moto and a resolver for the intrinsics that name them."""

    def __init__(
        self, template: dict[str, Any], parameters: dict[str, Any], session: Clients
    ) -> None:
        self.template = template
        self.session = session
        self.refs: dict[str, Any] = _pseudo_parameters()
        for name, spec in template.get("Parameters", {}).items():
            value = parameters.get(name, spec.get("Default"))
            if spec.get("Type") == "CommaDelimitedList":
                value = [v.strip() for v in str(value or "").split(",") if v.strip()]
            if value is not None:
                self.refs[name] = value
        self.skipped_outputs: list[str] = []  # the Outputs the harness cannot resolve
        self.conditions: dict[str, bool] = {}
        for name, expression in template.get("Conditions", {}).items():
            self.conditions[name] = bool(self.resolve(expression))

    def resource(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.template["Resources"][name]
        return found

    def of_type(self, kind: str) -> list[str]:
        return [n for n, r in self.template["Resources"].items() if r.get("Type") == kind]

    # -- intrinsics ------------------------------------------------------------------------------

    def resolve(self, node: Any) -> Any:
        """``node`` with its intrinsics resolved; what an ``AWS::NoValue`` chose is left out
        of its list or object, as CloudFormation leaves the property out."""
        if isinstance(node, list):
            return [v for v in (self.resolve(item) for item in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if node == {"Ref": "AWS::NoValue"}:
            return _NO_VALUE
        if len(node) != 1 or not _is_intrinsic(next(iter(node))):
            resolved = {key: self.resolve(value) for key, value in node.items()}
            return {key: value for key, value in resolved.items() if value is not _NO_VALUE}
        ((key, value),) = node.items()
        return self._intrinsic(key, value)

    def _intrinsic(self, key: str, value: Any) -> Any:
        if key == "Ref":
            return self._ref(value)
        if key == "Fn::GetAtt":
            target = value if isinstance(value, list) else value.split(".", 1)
            return self._ref(f"{target[0]}.{target[1]}")
        if key == "Fn::Sub":
            return self._sub(value)
        if key == "Fn::Join":
            separator, items = value[0], self.resolve(value[1])
            return separator.join(str(i) for i in items)
        if key == "Fn::Select":
            return self.resolve(value[1])[int(self.resolve(value[0]))]
        if key == "Fn::Split":
            return str(self.resolve(value[1])).split(value[0])
        if key == "Fn::If":
            return self.resolve(value[1] if self.conditions[value[0]] else value[2])
        if key == "Fn::Equals":
            return self.resolve(value[0]) == self.resolve(value[1])
        if key == "Fn::Not":
            return not self.resolve(value[0])
        if key == "Fn::And":
            return all(self.resolve(item) for item in value)
        if key == "Fn::Or":
            return any(self.resolve(item) for item in value)
        if key == "Condition":
            return self.conditions[value]
        return {key: self.resolve(value)}

    def _sub(self, value: Any) -> str:
        text, variables = (value[0], value[1]) if isinstance(value, list) else (value, {})
        local = {name: self.resolve(v) for name, v in variables.items()}

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            return str(local[name] if name in local else self._ref(name))

        return re.sub(r"\$\{([^}!][^}]*)\}", substitute, text)

    def _ref(self, name: str) -> Any:
        if name not in self.refs:
            raise Unresolvable(f"the harness has no value for {name}")
        return self.refs[name]

    # -- resources on moto -------------------------------------------------------------------

    def provision(self, search_endpoint: str) -> None:
        self._tables()
        self._storage_and_keys()
        self._named_only(search_endpoint)
        self._secret_policies_and_rotation()
        self._state_machines()
        self._cloudformation()

    def _tables(self) -> None:
        dynamodb = self.session.client("dynamodb")
        for name in self.of_type("AWS::DynamoDB::Table"):
            props = self.resource(name)["Properties"]
            table = f"engram-{TENANT}-{name}"
            dynamodb.create_table(
                TableName=table,
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
            )
            if props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled"):
                # moto's create_table takes no PITR setting (`admin backup` exports need it)
                dynamodb.update_continuous_backups(
                    TableName=table,
                    PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
                )
            ttl = props.get("TimeToLiveSpecification")
            if ttl:
                dynamodb.update_time_to_live(
                    TableName=table,
                    TimeToLiveSpecification={
                        "Enabled": bool(ttl["Enabled"]),
                        "AttributeName": ttl["AttributeName"],
                    },
                )
            self.refs[name] = table

    def _storage_and_keys(self) -> None:
        """Buckets, KMS keys and generated secrets."""
        client = self.session.client
        for name in self.of_type("AWS::S3::Bucket"):
            bucket = f"engram-{TENANT}-{name.lower()}"
            client("s3").create_bucket(Bucket=bucket)
            self.refs[name] = bucket
            self.refs[f"{name}.Arn"] = f"arn:aws:s3:::{bucket}"
        for name in self.of_type("AWS::KMS::Key"):
            props = self.resource(name)["Properties"]
            spec = {k: props[k] for k in ("KeySpec", "KeyUsage") if k in props}  # HMAC keys
            meta = client("kms").create_key(Description=name, **spec)["KeyMetadata"]
            self.refs[name], self.refs[f"{name}.Arn"] = meta["KeyId"], meta["Arn"]
        for name in self.of_type("AWS::SNS::Topic"):
            topic_name = self.resolve(self.resource(name)["Properties"].get("TopicName"))
            created = client("sns").create_topic(Name=topic_name or f"engram-{TENANT}-{name}")
            self.refs[name] = created["TopicArn"]
        for name in self.of_type("AWS::SecretsManager::Secret"):
            props = self.resource(name)["Properties"]
            spec = props.get("GenerateSecretString", {})
            value = secrets.token_urlsafe(96)[: int(spec.get("PasswordLength", 64))]
            key = {"KmsKeyId": self.resolve(props["KmsKeyId"])} if "KmsKeyId" in props else {}
            self.refs[name] = client("secretsmanager").create_secret(
                Name=f"engram-{TENANT}-{name}", SecretString=value, **key
            )["ARN"]

    def _named_only(self, search_endpoint: str) -> None:
        """Roles, the domain, the HTTP API and the functions: names and ARNs, nothing created on
        moto (the HTTP API is ``Harness._start_api``'s stand-in)."""
        for name in self.of_type("AWS::Serverless::HttpApi"):
            self.refs[name] = API_ID
        for name in self.of_type("AWS::IAM::Role"):
            self.refs[name] = f"engram-{TENANT}-{name}"
            self.refs[f"{name}.Arn"] = f"arn:aws:iam::{ACCOUNT}:role/engram-{TENANT}-{name}"
        for name in self.of_type("AWS::OpenSearchService::Domain"):
            self.refs[f"{name}.DomainEndpoint"] = search_endpoint.removeprefix("https://")
            self.refs[f"{name}.Arn"] = f"arn:aws:es:{REGION}:{ACCOUNT}:domain/engram-{TENANT}"
        for name in self.of_type("AWS::Serverless::Function"):
            function_name = self.resolve(self.resource(name)["Properties"]["FunctionName"])
            self.refs[name] = function_name
            self.refs[f"{name}.Arn"] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
            alias = self.resource(name)["Properties"].get("AutoPublishAlias")
            if alias:  # SAM's references to what it generates: !Ref X.Alias, X.Version
                self.refs[f"{name}.Alias"] = f"{self.refs[f'{name}.Arn']}:{alias}"
                self.refs[f"{name}.Version"] = f"{self.refs[f'{name}.Arn']}:{PUBLISHED_VERSION}"

    def aliases(self) -> dict[str, dict[str, str]]:
        """Function name -> {alias: the version it routes to}, for every ``AutoPublishAlias``:
        the first deploy publishes version 1 and points the alias at it (no shift: nothing to
        shift from). The CodeDeploy application and deployment groups that shift it on later
        deploys are not created: the harness runs one version of each function, and moto's
        CodeDeploy shifts no alias (tests/infra asserts their shape on the translated
        template)."""
        found: dict[str, dict[str, str]] = {}
        for name in self.of_type("AWS::Serverless::Function"):
            alias = self.resource(name)["Properties"].get("AutoPublishAlias")
            if alias:
                found[str(self.refs[name])] = {str(alias): PUBLISHED_VERSION}
        return found

    def _secret_policies_and_rotation(self) -> None:
        """Each secret's resource policy, as CloudFormation puts it, and its rotation schedule as
        CloudFormation leaves it: rotation on, with the function and the period (moto runs in
        this process). moto's RotateSecret would call the function through moto's own Lambda (a
        container), not the build: the run rotates through the build (``schedules``)."""
        from moto.secretsmanager.models import FakeSecret, secretsmanager_backends

        client = self.session.client("secretsmanager")
        for name in self.of_type("AWS::SecretsManager::ResourcePolicy"):
            props = self.resolve(self.resource(name)["Properties"])
            client.put_resource_policy(
                SecretId=props["SecretId"],
                ResourcePolicy=json.dumps(props["ResourcePolicy"]),
                BlockPublicPolicy=bool(props.get("BlockPublicPolicy", False)),
            )
        for name in self.of_type("AWS::SecretsManager::RotationSchedule"):
            props = self.resolve(self.resource(name)["Properties"])
            period = re.fullmatch(
                r"rate\((\d+) days?\)", props["RotationRules"]["ScheduleExpression"]
            )
            if period is None:
                raise Unresolvable(f"{name}: a rotation period other than rate(N days)")
            secret = secretsmanager_backends[ACCOUNT][REGION].secrets[props["SecretId"]]
            assert isinstance(secret, FakeSecret)
            # moto describes a secret's rotation only once one was requested
            secret.rotation_requested = secret.rotation_enabled = True
            secret.rotation_lambda_arn = props["RotationLambdaARN"]
            secret.auto_rotate_after_days = int(period.group(1))

    def _state_machines(self) -> None:
        stepfunctions = self.session.client("stepfunctions")
        for name in self.of_type("AWS::Serverless::StateMachine"):
            props = self.resource(name)["Properties"]
            text = (ROOT / props["DefinitionUri"]).read_text("utf-8")
            for variable, value in props.get("DefinitionSubstitutions", {}).items():
                text = text.replace("${" + variable + "}", str(self.resolve(value)))
            self.refs[name] = stepfunctions.create_state_machine(
                name=self.resolve(props["Name"]),
                definition=text,
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/{name}Role",
                type=props.get("Type", "STANDARD"),
            )["stateMachineArn"]

    def _cloudformation(self) -> None:
        """The stack in moto's CloudFormation, as ``engram-memory admin --stack`` reads it
        (``resolve_stack``): named ``AWS::StackName``, its ``TenantId`` parameter, the template's
        Outputs resolved against the harness's resources (``skipped_outputs``: those naming what
        the harness does not have), and as its resources the template's log groups, which moto's
        CloudFormation creates in moto's CloudWatch Logs (the functions' groups, where the Lambda
        service writes each invocation's lines; the operator's audit group). Every other resource
        is the harness's own, created above and not listed by CloudFormation: the drainer is then
        found by the name ``resolve_stack`` falls back to, the template's ``FunctionName``."""
        groups: dict[str, Any] = {}
        for name in self.of_type("AWS::Logs::LogGroup"):
            resource = self.resource(name)
            if not self.conditions.get(resource.get("Condition", ""), True):
                continue
            props = resource["Properties"]
            group = str(self.resolve(props["LogGroupName"]))
            self.refs[name] = group
            self.refs[f"{name}.Arn"] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:*"
            groups[name] = {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": group}}
            if "RetentionInDays" in props:
                days = int(self.resolve(props["RetentionInDays"]))
                groups[name]["Properties"]["RetentionInDays"] = days
        outputs: dict[str, Any] = {}
        for name, output in self.template.get("Outputs", {}).items():
            if not self.conditions.get(output.get("Condition", ""), True):
                continue
            try:
                outputs[name] = {"Value": str(self.resolve(output["Value"]))}
            except Unresolvable:
                self.skipped_outputs.append(name)
        body = {
            "Parameters": {"TenantId": {"Type": "String"}},
            "Resources": groups,
            "Outputs": outputs,
        }
        self.session.client("cloudformation").create_stack(
            StackName=self.refs["AWS::StackName"],
            TemplateBody=json.dumps(body),
            Parameters=[{"ParameterKey": "TenantId", "ParameterValue": self.refs["TenantId"]}],
        )

    # -- functions ---------------------------------------------------------------------------

    def functions(self) -> dict[str, dict[str, Any]]:
        """Logical id -> its merged properties (Globals.Function, then its own)."""
        defaults = self.template.get("Globals", {}).get("Function", {})
        merged: dict[str, dict[str, Any]] = {}
        for name in self.of_type("AWS::Serverless::Function"):
            props = {**copy.deepcopy(defaults), **self.resource(name)["Properties"]}
            variables = {
                **defaults.get("Environment", {}).get("Variables", {}),
                **self.resource(name)["Properties"].get("Environment", {}).get("Variables", {}),
            }
            props["Environment"] = {"Variables": variables}
            merged[name] = props
        return merged
