// A Spark RPC client for e2e/test_spark_on_kubernetes.py: asks the driver at the URL in args[0] whether its
// endpoint exists, as an executor's first call does, once per way of authenticating. Prints one line per
// try: "<try> ACCEPTED" or "<try> REFUSED <error>". Run with Spark's jars on the class path (Java's source
// launcher compiles it). The tries: `none` (no authentication), `wrong` (a secret of its own), `table`
// (the secret in the variable _SPARK_AUTH_SECRET, which Spark's SecurityManager reads first; the test sets
// it to the table's Secret as the API returns it: Spark too uses the base64 of the file's bytes).
import org.apache.spark.SecurityManager;
import org.apache.spark.SparkConf;
import org.apache.spark.rpc.RpcEnv;
import org.apache.spark.rpc.RpcEnv$;

public class SparkRpcProbe {
    private static final org.apache.spark.internal.config.ConfigEntry<scala.Option<String>> SECRET_FILE =
        org.apache.spark.internal.config.package$.MODULE$.AUTH_SECRET_FILE();

    public static void main(String[] args) throws Exception {
        String url = args[0];
        for (String attempt : new String[] {"none", "wrong", "table"}) {
            SparkConf conf = new SparkConf(false)
                .set("spark.rpc.askTimeout", "20s")
                .set("spark.network.timeout", "20s")
                .set("spark.rpc.io.numConnectionsPerPeer", "1");
            if (!attempt.equals("none")) {
                conf.set("spark.authenticate", "true")
                    .set("spark.network.crypto.enabled", "true")
                    .set("spark.network.crypto.saslFallback", "false");
            }
            SecurityManager security = attempt.equals("wrong")
                ? new SecurityManager(conf, scala.Option.empty(), SECRET_FILE) {
                    @Override
                    public String getSecretKey() {
                        return "bm90LXRoZS10YWJsZXMtc2VjcmV0";
                    }
                }
                : new SecurityManager(conf, scala.Option.empty(), SECRET_FILE);
            RpcEnv env = RpcEnv$.MODULE$.create(
                "probe-" + attempt, "127.0.0.1", "127.0.0.1", 0, conf, security, 0, true);
            try {
                env.setupEndpointRefByURI(url);
                System.out.println(attempt + " ACCEPTED");
            } catch (Exception error) {
                // Each cause's first line (a remote error's message holds the server's stack trace).
                StringBuilder causes = new StringBuilder();
                for (Throwable cause = error; cause != null; cause = cause.getCause()) {
                    String line = cause.toString().split("[\n\t]")[0];
                    causes.append(causes.length() == 0 ? "" : " <- ").append(line);
                }
                System.out.println(attempt + " REFUSED " + causes);
            } finally {
                env.shutdown();
                env.awaitTermination();
            }
        }
        System.out.flush();
        System.exit(0);
    }
}
