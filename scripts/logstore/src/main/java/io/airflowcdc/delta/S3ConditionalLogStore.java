package io.airflowcdc.delta;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A Delta Lake LogStore for S3 (s3a://) that writes each commit file put-if-absent, so that
 * any number of Spark drivers can commit to one table: the loser of a race for version N gets
 * {@link FileAlreadyExistsException}, and Delta checks for conflicts and retries at N+1, as it
 * does on HDFS.
 *
 * <p>Delta's S3SingleDriverLogStore checks for the file (HEAD) and then PUTs it: correct only for
 * one driver per table, since a second driver's PUT overwrites a commit between the two.  A plain
 * {@code FileSystem.create(path, false)} on S3A (Hadoop 3.5.0) does the same: a HEAD/LIST probe
 * when the stream opens and an unconditional PUT when it closes.  Here the commit file is written
 * through S3A's {@code createFile()} builder with the option
 * {@value #CONDITIONAL_OVERWRITE}, which makes the PUT (or the multipart upload's completion)
 * carry {@code If-None-Match: *}: S3 answers 412 when the key already exists, which S3A raises as
 * {@link RemoteFileChangedException} and this store turns into {@link FileAlreadyExistsException}.
 * Nothing is visible before the upload completes (S3 objects appear whole), so
 * {@link #isPartialWriteVisible} is false.
 *
 * <p>Needs a store that honours conditional writes (AWS S3 since August 2024, recent MinIO,
 * s3proxy 4.x, ...) and {@value #S3A_CONDITIONAL_ENABLED} = true (Hadoop 3.5.0's default).  Once
 * per JVM and bucket, before the first commit, it checks that the store really refuses a second
 * If-None-Match PUT of one key (two small PUTs and a DELETE of a probe object beside the commit
 * files; {@value #PROBE_KEY} = false skips that); a store that ignores the header fails that check
 * with an error naming the settings, instead of silently losing commits.
 *
 * <p>Configured per scheme: {@code spark.delta.logStore.s3a.impl=io.airflowcdc.delta.S3ConditionalLogStore}.
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

    private static final Logger LOG = LoggerFactory.getLogger(S3ConditionalLogStore.class);

    /** createFile() option: the PUT fails if the object exists (Hadoop 3.5.0, HADOOP-19256). */
    public static final String CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite";
    /** S3A's switch for conditional writes (default true in Hadoop 3.5.0). */
    public static final String S3A_CONDITIONAL_ENABLED = "fs.s3a.create.conditional.enabled";
    /** Hadoop setting: check once per bucket that the store refuses a second conditional PUT. */
    public static final String PROBE_KEY = "airflowcdc.delta.logstore.probe";

    /** Buckets (scheme://authority) whose store was seen to refuse a conditional overwrite. */
    private static final Set<String> VERIFIED = ConcurrentHashMap.newKeySet();
    /** Commit files this JVM found already written by another writer (put-if-absent refused). */
    private static final AtomicLong CONFLICTS = new AtomicLong();

    public S3ConditionalLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    /** How many writes this JVM lost to a file that was already there (for tests and metrics). */
    public static long conflicts() {
        return CONFLICTS.get();
    }

    @Override
    public void write(
            Path path,
            Iterator<String> actions,
            Boolean overwrite,
            Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) {
            // _last_checkpoint, manifests: a whole-object PUT replaces the old one atomically
            writeAll(fs.create(path, true), actions);
            return;
        }
        Path qualified = fs.makeQualified(path);
        requireConditionalWrites(fs, qualified, hadoopConf);
        try {
            putIfAbsent(fs, qualified, actions);
        } catch (FileAlreadyExistsException e) {
            CONFLICTS.incrementAndGet();
            LOG.info("{} was written by another writer first: Delta checks for conflicts and retries",
                qualified);
            throw e;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }

    /** Write {@code lines} to {@code path} with If-None-Match: *, or throw FileAlreadyExistsException. */
    @SuppressWarnings({"rawtypes", "unchecked"})
    static void putIfAbsent(FileSystem fs, Path path, Iterator<String> lines) throws IOException {
        try {
            // FileSystem.createFile returns the raw builder type: build() is an Object
            FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
                .create()
                .overwrite(false)
                .must(CONDITIONAL_OVERWRITE, true)
                .build();
            writeAll(out, lines);
        } catch (RemoteFileChangedException e) {
            // S3A's translation of 412 Precondition Failed (and of S3 Express's 200 PreconditionFailed)
            FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
            exists.initCause(e);
            throw exists;
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
            exists.initCause(e);
            throw exists;
        }
    }

    /**
     * Write every line, then close: S3A uploads on close(), and for a conditional create the store
     * decides there whether the key was free.  If writing fails part-way (the iterator throws, say)
     * the upload is aborted rather than closed, so no partial file is ever published.
     */
    private static void writeAll(FSDataOutputStream out, Iterator<String> lines) throws IOException {
        boolean written = false;
        try {
            while (lines.hasNext()) {
                out.write((lines.next() + "\n").getBytes(StandardCharsets.UTF_8));
            }
            written = true;
        } finally {
            if (!written) {
                try {
                    out.abort();
                } catch (RuntimeException e) {  // UnsupportedOperationException: not abortable
                    LOG.warn("could not abort a failed write: {}", e.toString());
                }
            }
        }
        out.close();
    }

    private static IOException unavailable(Path path, String why) {
        return new IOException(String.format(
            "%s cannot write Delta commits put-if-absent at %s: %s. It needs a store that honours "
                + "S3 conditional writes (PUT with If-None-Match: *) and %s=true (Hadoop 3.5.0's "
                + "default). With a single writer per table, %s=io.delta.storage.S3SingleDriverLogStore "
                + "is the alternative (two concurrent writers can then lose commits).",
            S3ConditionalLogStore.class.getSimpleName(), path, why, S3A_CONDITIONAL_ENABLED,
            "spark.delta.logStore." + path.toUri().getScheme() + ".impl"));
    }

    /**
     * Fail with a clear error unless the filesystem of {@code path} makes conditional creates,
     * and (once per bucket) unless the store refuses a second one.
     */
    private static void requireConditionalWrites(FileSystem fs, Path path, Configuration conf)
            throws IOException {
        if (!fs.hasPathCapability(path, CONDITIONAL_OVERWRITE)) {
            throw unavailable(path, fs.getClass().getName() + " does not offer " + CONDITIONAL_OVERWRITE
                + " (S3A with " + S3A_CONDITIONAL_ENABLED + "=false, or not S3A)");
        }
        String bucket = fs.getUri().toString();
        if (VERIFIED.contains(bucket) || !conf.getBoolean(PROBE_KEY, true)) {
            return;
        }
        Path probe = new Path(path.getParent(), ".conditional-write-probe-" + UUID.randomUUID());
        try {
            try {
                putIfAbsent(fs, probe, Set.of("first").iterator());
            } catch (IOException e) {
                IOException err = unavailable(path, "the store refused a conditional PUT: " + e);
                err.initCause(e);
                throw err;
            }
            try {
                putIfAbsent(fs, probe, Set.of("second").iterator());
            } catch (FileAlreadyExistsException expected) {
                VERIFIED.add(bucket);
                return;
            }
            throw unavailable(path, "the store accepted a second PUT with If-None-Match: * of "
                + probe + " (it ignores the condition)");
        } finally {
            try {
                fs.delete(probe, false);
            } catch (IOException e) {
                LOG.warn("could not delete the probe object {}: {}", probe, e.toString());
            }
        }
    }
}
