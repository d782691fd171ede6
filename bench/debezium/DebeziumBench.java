import java.io.BufferedWriter;
import java.io.IOException;
import java.io.Reader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import javax.management.MBeanServer;
import javax.management.ObjectName;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

/**
 * Debezium's embedded engine (the default, asynchronous one) with a small file sink, for
 * bench/vs_debezium.py.
 *
 * <p>Usage: {@code java DebeziumBench <connector.properties> <out.jsonl> <topic> <events> <idle-s>}.
 * Runs {@code DebeziumEngine.create(Json.class)} (Kafka's JsonConverter, schemas enabled: the
 * engine's defaults) with the properties file as given, writes each record's JSON value on a line
 * of {@code out.jsonl} (a buffered writer), and stops after {@code events} data events: records
 * sent to {@code topic} (the table's topic) with a value; schema changes, heartbeats and
 * tombstones are written but not counted.  With {@code events} = 0 it stops instead once the
 * streaming phase is connected (the {@code Connected} attribute of Debezium's streaming metrics
 * MBean): a first run that leaves a slot or a binlog offset behind, as a connector deployed
 * before the writes would.  Records are marked processed, so the offset store is flushed on close.
 * A connector with a schema history (MariaDB, MySQL) keeps its position only in that offset store,
 * and its snapshot's records (schema changes, even with {@code snapshot.mode=no_data}) carry it:
 * with such a connector the first run also waits for the snapshot's last record ({@code "snapshot":
 * "last"} in its source) to be processed, else the next run finds no offset and snapshots anew at
 * the binlog's end, after the writes.
 *
 * <p>Prints one line {@code RESULT {json}}: the counts, the wall and process CPU times (from
 * JVM start to the first data event, and from the first to the last one counted) and the bytes
 * written.  Exits 2 when no data event arrived for {@code idle-s} seconds, 3 when the engine
 * stopped by itself before the count was reached, 4 on any other failure.
 */
public final class DebeziumBench {

    private final String topic;
    private final long target;
    private final boolean historized;
    private final BufferedWriter out;
    private final CountDownLatch done = new CountDownLatch(1);
    private volatile long counted;
    private volatile long records;
    private long extra;
    private long firstNanos;
    private long lastNanos;
    private double firstCpu;
    private double lastCpu;
    private volatile long progressNanos = System.nanoTime();
    private volatile boolean snapshotEnded;

    private DebeziumBench(String topic, long target, boolean historized, BufferedWriter out) {
        this.topic = topic;
        this.target = target;
        this.historized = historized;
        this.out = out;
    }

    /** Process CPU seconds (user + system, all threads) so far. */
    private static double cpuSeconds() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime() / 1e9;
    }

    /** The sink: called by the engine with each batch, in order, on one thread at a time. */
    private void handleBatch(List<ChangeEvent<String, String>> batch,
                             DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
            throws InterruptedException {
        try {
            boolean lastOfSnapshot = false;
            for (ChangeEvent<String, String> record : batch) {
                records++;
                String value = record.value();
                if (value != null) {
                    out.write(value);
                    out.write('\n');
                    lastOfSnapshot |= value.contains("\"snapshot\":\"last\"");
                }
                if (value != null && topic.equals(record.destination())) {
                    count();
                }
                committer.markProcessed(record);
            }
            committer.markBatchFinished();
            if (lastOfSnapshot) {
                snapshotEnded = true;
            }
            if (counted >= target && target > 0) {
                out.flush();
                done.countDown();
            }
        }
        catch (IOException e) {
            throw new IllegalStateException("cannot write the sink file", e);
        }
    }

    private void count() {
        long now = System.nanoTime();
        progressNanos = now;
        if (counted >= target) {
            extra++;
            return;
        }
        if (counted == 0) {
            firstNanos = now;
            firstCpu = cpuSeconds();
        }
        counted++;
        if (counted == target) {
            lastNanos = System.nanoTime();
            lastCpu = cpuSeconds();
        }
    }

    /** True once a streaming metrics MBean of any Debezium connector reports Connected. */
    private static boolean streamingConnected() {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        try {
            Set<ObjectName> names = server.queryNames(
                    new ObjectName("debezium.*:type=connector-metrics,context=streaming,*"), null);
            for (ObjectName name : names) {
                if (Boolean.TRUE.equals(server.getAttribute(name, "Connected"))) {
                    return true;
                }
            }
        }
        catch (Exception e) {
            return false; // not registered yet
        }
        return false;
    }

    /** True once a first run (target 0) may stop: streaming, and any snapshot position processed. */
    private boolean firstRunDone() {
        return (!historized || snapshotEnded) && streamingConnected();
    }

    /** Wait for the count (or, with target 0, for streaming); returns the exit code. */
    private int await(long idleSeconds, AtomicReference<String> failure) throws InterruptedException {
        long idle = TimeUnit.SECONDS.toNanos(idleSeconds);
        while (true) {
            if (target == 0 ? firstRunDone() : done.await(100, TimeUnit.MILLISECONDS)) {
                return 0;
            }
            if (target == 0) {
                Thread.sleep(100);
            }
            if (failure.get() != null) {
                return 3;
            }
            if (System.nanoTime() - progressNanos > idle) {
                return 2;
            }
        }
    }

    private String result(int code, long startNanos, String failure) {
        double jvmStart = ManagementFactory.getRuntimeMXBean().getStartTime() / 1e3;
        double mainStart = System.currentTimeMillis() / 1e3 - (System.nanoTime() - startNanos) / 1e9;
        double engineToFirst = counted > 0 ? (firstNanos - startNanos) / 1e9 : -1;
        return String.format(Locale.ROOT,
                "{\"code\": %d, \"events\": %d, \"extra\": %d, \"records\": %d, \"jvm_to_main_s\": %.3f, "
                        + "\"main_to_first_s\": %.3f, \"first_cpu_s\": %.3f, \"elapsed_s\": %.3f, \"cpu_s\": %.3f, "
                        + "\"processing_threads\": %d, \"failure\": %s}",
                code, counted, extra, records, mainStart - jvmStart, engineToFirst, firstCpu,
                (lastNanos - firstNanos) / 1e9, lastCpu - firstCpu,
                Runtime.getRuntime().availableProcessors(),
                failure == null ? "null" : "\"" + failure.replace("\\", "\\\\").replace("\"", "'") + "\"");
    }

    public static void main(String[] args) throws Exception {
        long startNanos = System.nanoTime();
        Properties props = new Properties();
        try (Reader reader = Files.newBufferedReader(Paths.get(args[0]), StandardCharsets.UTF_8)) {
            props.load(reader);
        }
        Path outPath = Paths.get(args[1]);
        long target = Long.parseLong(args[3]);
        AtomicReference<String> failure = new AtomicReference<>();
        int code;
        DebeziumBench bench;
        try (BufferedWriter out = Files.newBufferedWriter(outPath, StandardCharsets.UTF_8)) {
            bench = new DebeziumBench(args[2], target, props.containsKey("schema.history.internal"), out);
            DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                    .using(props)
                    .notifying(bench::handleBatch)
                    .using((success, message, error) -> {
                        if (!success || error != null) {
                            failure.compareAndSet(null, message + (error == null ? "" : ": " + error));
                        }
                        else {
                            failure.compareAndSet(null, "engine stopped: " + message);
                        }
                    })
                    .build();
            ExecutorService executor = Executors.newSingleThreadExecutor();
            executor.execute(engine);
            code = bench.await(Long.parseLong(args[4]), failure);
            try {
                engine.close(); // commits the offsets of the records marked processed
            }
            catch (IllegalStateException e) {
                // it stopped by itself (a failure, recorded by the callback)
            }
            executor.shutdown();
            executor.awaitTermination(60, TimeUnit.SECONDS);
            out.flush();
        }
        catch (Exception e) {
            e.printStackTrace();
            System.exit(4); // the engine's threads must not keep the JVM alive
            return;
        }
        String why = code == 0 ? null : failure.get() != null ? failure.get() : "no data event for " + args[4] + " s";
        System.out.println("RESULT " + bench.result(code, startNanos, why));
        System.out.flush();
        System.exit(code);
    }
}
