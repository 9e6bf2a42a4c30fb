// Health check of the kinesis-mock container: healthy once every stream of INITIALIZE_STREAMS is
// ACTIVE, so `depends_on: {kinesis-mock: {condition: service_healthy}}` means "ready to consume".
// kinesis-mock answers 404 on GET / and wants a SigV4-shaped Authorization header (it does not
// verify the signature), so this asks it a real Kinesis question instead. Exit status 0 = healthy.
"use strict";
const http = require("http");

const port = Number(process.env.KINESIS_MOCK_PLAIN_PORT || 4568);
const defaultRegion = process.env.AWS_REGION || "us-east-1";
// INITIALIZE_STREAMS entries are "name[:shardCount[:region]]" (kinesis-mock's README).
const streams = (process.env.INITIALIZE_STREAMS || "")
  .split(",")
  .map((entry) => entry.trim())
  .filter((entry) => entry.length > 0)
  .map((entry) => {
    const [name, , region] = entry.split(":");
    return { name, region: region || defaultRegion };
  });

function kinesis(action, body, region) {
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/",
        timeout: 5000,
        headers: {
          "Content-Type": "application/x-amz-json-1.1",
          "X-Amz-Target": `Kinesis_20131202.${action}`,
          "X-Amz-Date": "20260101T000000Z",
          Authorization:
            `AWS4-HMAC-SHA256 Credential=healthcheck/20260101/${region}/kinesis/aws4_request, ` +
            "SignedHeaders=host, Signature=0",
        },
      },
      (response) => {
        let text = "";
        response.on("data", (chunk) => (text += chunk));
        response.on("end", () =>
          response.statusCode === 200
            ? resolve(JSON.parse(text))
            : reject(new Error(`${action}: HTTP ${response.statusCode} ${text}`)),
        );
      },
    );
    request.on("timeout", () => request.destroy(new Error(`${action}: no answer within 5 s`)));
    request.on("error", reject);
    request.end(JSON.stringify(body));
  });
}

async function main() {
  if (streams.length === 0) {
    await kinesis("ListStreams", {}, defaultRegion);
    return;
  }
  for (const { name, region } of streams) {
    const summary = await kinesis("DescribeStreamSummary", { StreamName: name }, region);
    const status = summary.StreamDescriptionSummary.StreamStatus;
    if (status !== "ACTIVE") {
      throw new Error(`stream ${name} (${region}) is ${status}`);
    }
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(`kinesis-mock is not ready: ${error.message}`);
    process.exit(1);
  },
);
